/* A stand-in CUDA driver for tests on machines without a GPU: it loads, starts, reports driver 12.8 and
 * no devices. Compiled by tests/gpu.rs with `cc -shared -fPIC -o DIR/libcuda.so.1`; every other driver
 * function is absent, so code that calls one would fail the test (cudarc panics on a missing symbol).
 * With -DSTUB_BROKEN it also lacks cuDeviceGetCount: a driver library vserve cannot use. */
int cuInit(unsigned int flags) { (void)flags; return 0; }
int cuDriverGetVersion(int *version) { *version = 12080; return 0; }
#ifndef STUB_BROKEN
int cuDeviceGetCount(int *count) { *count = 0; return 0; }
#endif
