/* kda_cuda_api.h — the few CUDA-only helpers the host and the Lua layer may call.
 * Plain C, no macros inside declarations, so lua/kda/ffi.lua may cdef it as it stands
 * (after stripping the preprocessor lines). Every function is safe to call without a GPU:
 * it then returns 0 / -1 and sets kda_last_error().                                      */
#ifndef KDA_CUDA_API_H
#define KDA_CUDA_API_H
#ifdef __cplusplus
extern "C" {
#endif

/* Most bytes of device memory kda held at once since the backend started (or since the last
 * kda_cuda_reset_peak_mem): buffers from alloc, the scratch area, the cuBLASLt workspace. */
double kda_cuda_peak_mem_bytes(void);
double kda_cuda_cur_mem_bytes(void);
void kda_cuda_reset_peak_mem(void);

/* The one stream every kda kernel runs on (a cudaStream_t), for benchmarks' events. */
void *kda_cuda_stream(void);

/* Wait for every queued kernel; 0, or -1 with the asynchronous error named. */
int kda_cuda_synchronize(void);

/* GPU utilisation sampler: NVML (dlopen'ed libnvidia-ml.so.1) read every 100 ms by a
 * background thread. start returns -1 if NVML is missing; stop writes the mean of the
 * samples taken (percent of time a kernel ran) and the number of samples is returned. */
int kda_cuda_util_start(void);
int kda_cuda_util_stop(double *mean_pct);

/* GPU milliseconds of the forward, backward and optimizer stages of the last training step
 * (events recorded inside the step, graph or eager): ms[0..2]. Waits for that step. */
int kda_cuda_stage_ms(double *ms);

/* 0: run every list eagerly (what --no-graph and KDA_NO_GRAPH=1 do); 1: capture and replay. */
int kda_cuda_set_graphs(int on);

/* 0: run every node alone (what KDA_NO_FUSE=1 does); 1: run the pairs the backend proves safe
 * as one kernel each (the default; backend_cuda.cu lists them). */
int kda_cuda_set_fusion(int on);
/* The pairs fused in the list run last, by kind: counts[0] add+rmsnorm, [1] rmsnorm_bwd+add,
 * [2] matmul+add, [3] cross_entropy+bwd. */
int kda_cuda_fusion_counts(int *counts);

/* Name of device 0 and its dense bf16 peak in FLOP/s from a small table (0 if unknown). */
const char *kda_cuda_device_name(void);
double kda_cuda_bf16_peak_flops(void);

#ifdef __cplusplus
}
#endif
#endif
