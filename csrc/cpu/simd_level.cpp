// Which vector paths the CPU kernels were compiled with (all files share the build's flags):
// "avx512" or "avx2" for the float32 top-k filter and the float32 / int32 sparse merge, else
// "scalar" (other types always run the scalar loops).
#include "gtopk/cpu_ops.h"

namespace gtopk::cpu {

const char* simd_level() {
#if defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__)
    return "avx2";
#else
    return "scalar";
#endif
}

}  // namespace gtopk::cpu
