# ruff: noqa: ANN001, ANN201, UP008, UP031, UP032 - Horovod's code kept as upstream wrote it
# Trimmed copy of horovod/examples/pytorch/pytorch_synthetic_benchmark.py at v0.28.1,
# Copyright Horovod authors, Apache-2.0 (see tests/horovod_upstream/LICENSE).
# Changes:
#   (a) small sizes: --model picks one of two small torchvision-free models defined here
#       ('cnn', the default, or 'mlp') on 3x32x32 fake images and 10 classes, instead of
#       torchvision.models (resnet50) on 3x224x224 and 1000 classes; --batch-size 16,
#       --num-warmup-batches 2, --num-batches-per-iter 5, --num-iters 3 by default.
#   (b) gtopk_hvd: the import `import gtopk_hvd.torch as gtopk` and the compression line
#       (`--gtopk-density D`: gtopk.Compression.gtopk(D); 0, the default: Horovod's line as is).
#   (c) a final `CHECKSUM rank=<r> <sha256>` line of the parameters on every rank, for
#       tests/horovod/test_horovod_examples.py.
#   (d) the fake data seeded by rank (torch.manual_seed(1000 + rank)) and a `DATA rank=<r>
#       <sha256>` line of it: every rank trains on its own data, so a reduction that is not
#       the same all-reduce on every rank leaves the replicas different (with the same data
#       everywhere, even no reduction at all would keep them identical).
import argparse
import hashlib
import timeit

import horovod.torch as hvd
import numpy as np
import torch.backends.cudnn as cudnn
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import gtopk_hvd.torch as gtopk  # gtopk_hvd: the import (before hvd.init())

# Small stand-ins for torchvision.models (3x32x32 images, 10 classes).
models = {
    'cnn': lambda: nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10)),
    'mlp': lambda: nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 32 * 32, 128), nn.ReLU(), nn.Linear(128, 10)),
}

# Benchmark settings
parser = argparse.ArgumentParser(description='PyTorch Synthetic Benchmark',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--fp16-allreduce', action='store_true', default=False,
                    help='use fp16 compression during allreduce')

parser.add_argument('--model', type=str, default='cnn', choices=sorted(models),
                    help='model to benchmark')
parser.add_argument('--batch-size', type=int, default=16,
                    help='input batch size')

parser.add_argument('--num-warmup-batches', type=int, default=2,
                    help='number of warm-up batches that don\'t count towards benchmark')
parser.add_argument('--num-batches-per-iter', type=int, default=5,
                    help='number of batches per benchmark iteration')
parser.add_argument('--num-iters', type=int, default=3,
                    help='number of benchmark iterations')

parser.add_argument('--no-cuda', action='store_true', default=False,
                    help='disables CUDA training')

parser.add_argument('--use-adasum', action='store_true', default=False,
                    help='use adasum algorithm to do reduction')
parser.add_argument('--gtopk-density', type=float, default=0.0,
                    help='gtopk_hvd: gTop-k density (0: Horovod\'s dense allreduce)')

args = parser.parse_args()
args.cuda = not args.no_cuda and torch.cuda.is_available()

hvd.init()

if args.cuda:
    # Horovod: pin GPU to local rank.
    torch.cuda.set_device(hvd.local_rank())

cudnn.benchmark = True

# Set up standard model.
model = models[args.model]()

# By default, Adasum doesn't need scaling up learning rate.
lr_scaler = hvd.size() if not args.use_adasum else 1

if args.cuda:
    # Move model to GPU.
    model.cuda()
    # If using GPU Adasum allreduce, scale learning rate by local_size.
    if args.use_adasum and hvd.nccl_built():
        lr_scaler = hvd.local_size()

optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)

# Horovod: (optional) compression algorithm.
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
if args.gtopk_density:  # gtopk_hvd: the one changed line
    compression = gtopk.Compression.gtopk(args.gtopk_density)

# Horovod: wrap optimizer with DistributedOptimizer.
optimizer = hvd.DistributedOptimizer(optimizer,
                                     named_parameters=model.named_parameters(),
                                     compression=compression,
                                     op=hvd.Adasum if args.use_adasum else hvd.Average)

# Horovod: broadcast parameters & optimizer state.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

# Set up fixed fake data
torch.manual_seed(1000 + hvd.rank())  # (d) different data on every rank
data = torch.randn(args.batch_size, 3, 32, 32)
target = torch.LongTensor(args.batch_size).random_() % 10
if args.cuda:
    data, target = data.cuda(), target.cuda()


def benchmark_step():
    optimizer.zero_grad()
    output = model(data)
    loss = F.cross_entropy(output, target)
    loss.backward()
    optimizer.step()


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end='\n' if nl else '')


log('Model: %s' % args.model)
log('Batch size: %d' % args.batch_size)
device = 'GPU' if args.cuda else 'CPU'
log('Number of %ss: %d' % (device, hvd.size()))

# Warm-up
log('Running warmup...')
timeit.timeit(benchmark_step, number=args.num_warmup_batches)

# Benchmark
log('Running benchmark...')
img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_sec = args.batch_size * args.num_batches_per_iter / time
    log('Iter #%d: %.1f img/sec per %s' % (x, img_sec, device))
    img_secs.append(img_sec)

# Results
img_sec_mean = np.mean(img_secs)
img_sec_conf = 1.96 * np.std(img_secs)
log('Img/sec per %s: %.1f +-%.1f' % (device, img_sec_mean, img_sec_conf))
log('Total img/sec on %d %s(s): %.1f +-%.1f' %
    (hvd.size(), device, hvd.size() * img_sec_mean, hvd.size() * img_sec_conf))

print('DATA rank=%d %s' % (hvd.rank(), hashlib.sha256(
    data.cpu().numpy().tobytes() + target.cpu().numpy().tobytes()).hexdigest()), flush=True)
digest = hashlib.sha256()
for tensor in model.state_dict().values():
    digest.update(tensor.detach().cpu().numpy().tobytes())
print('CHECKSUM rank=%d %s' % (hvd.rank(), digest.hexdigest()), flush=True)
