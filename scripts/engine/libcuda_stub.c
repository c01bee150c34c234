/* A stand-in libcuda.so.1 for SGLang's CPU engine on a machine with no NVIDIA driver.
 *
 * Why: the sglang-kernel wheel (imported unconditionally by SGLang 0.5.23, mem_cache/memory_pool.py:42)
 * ships common_ops.abi3.so, which is linked against libcuda.so.1 and resolves one driver symbol
 * (cuPointerGetAttribute). Without a libcuda.so.1 the import fails and SGLang never starts, even on its CPU path,
 * which calls none of the kernel's ops. Every entry point here answers CUDA_ERROR_NO_DEVICE (100), so nothing
 * can mistake this machine for one with a GPU: torch still reports no CUDA.
 *
 * Built at install time by scripts/install-sglang-engine.sh with the machine's cc; never shipped as a binary.
 */
#include <stddef.h>

#define CUDA_ERROR_NO_DEVICE 100

typedef int CUresult;

CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDriverGetVersion(int *v) { if (v) *v = 0; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDeviceGetCount(int *n) { if (n) *n = 0; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDeviceGet(int *d, int ordinal) { (void)d; (void)ordinal; return CUDA_ERROR_NO_DEVICE; }
CUresult cuPointerGetAttribute(void *data, int attribute, unsigned long long ptr) {
    (void)data; (void)attribute; (void)ptr; return CUDA_ERROR_NO_DEVICE;
}
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    (void)symbol; (void)version; (void)flags; if (pfn) *pfn = NULL; return CUDA_ERROR_NO_DEVICE;
}
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, void *status) {
    (void)symbol; (void)version; (void)flags; (void)status; if (pfn) *pfn = NULL; return CUDA_ERROR_NO_DEVICE;
}
CUresult cuGetErrorString(CUresult error, const char **str) {
    (void)error; if (str) *str = "sgl-seat stub libcuda: no CUDA device"; return 0;
}
CUresult cuGetErrorName(CUresult error, const char **str) {
    (void)error; if (str) *str = "CUDA_ERROR_NO_DEVICE"; return 0;
}
