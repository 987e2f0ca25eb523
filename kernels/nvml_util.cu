/* nvml_util.cu — GPU utilisation sampler (kda_cuda_util_start / _stop in kda_cuda_api.h).
 * NVML is loaded with dlopen("libnvidia-ml.so.1") so that kda neither needs the NVML header
 * nor fails to start where the driver library is missing; the few entry points are declared
 * here by hand. A background thread reads nvmlDeviceGetUtilizationRates (percent of the
 * last sample period in which a kernel ran) every 100 ms.                                */
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include "kernels.h"
#include "kda_cuda_api.h"

typedef struct { unsigned int gpu, memory; } nvml_util_t;
typedef int (*nvml_init_fn)(void);
typedef int (*nvml_shutdown_fn)(void);
typedef int (*nvml_handle_fn)(unsigned int, void **);
typedef int (*nvml_rates_fn)(void *, nvml_util_t *);

static struct {
  void *lib;
  nvml_init_fn init;
  nvml_shutdown_fn shutdown;
  nvml_handle_fn handle;
  nvml_rates_fn rates;
  void *dev;
  pthread_t thread;
  volatile int running;
  double sum;
  long count;
} U;

static int load_nvml(void) {
  if (U.lib) return 0;
  U.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!U.lib) return kda_set_error("nvml: dlopen(libnvidia-ml.so.1) failed: no NVIDIA driver library; utilisation is not measured");
  U.init = (nvml_init_fn)dlsym(U.lib, "nvmlInit_v2");
  U.shutdown = (nvml_shutdown_fn)dlsym(U.lib, "nvmlShutdown");
  U.handle = (nvml_handle_fn)dlsym(U.lib, "nvmlDeviceGetHandleByIndex_v2");
  U.rates = (nvml_rates_fn)dlsym(U.lib, "nvmlDeviceGetUtilizationRates");
  if (!U.init || !U.shutdown || !U.handle || !U.rates) {
    dlclose(U.lib);
    U.lib = NULL;
    return kda_set_error("nvml: libnvidia-ml.so.1 lacks nvmlInit_v2 / nvmlDeviceGetUtilizationRates");
  }
  return 0;
}

static void *sampler(void *arg) {
  (void)arg;
  struct timespec ts = {0, 100 * 1000 * 1000};
  while (U.running) {
    nvml_util_t r;
    if (U.rates(U.dev, &r) == 0) {
      U.sum += r.gpu;
      U.count++;
    }
    nanosleep(&ts, NULL);
  }
  return NULL;
}

extern "C" int kda_cuda_util_start(void) {
  if (U.running) return 0;
  if (load_nvml()) return -1;
  if (U.init() != 0) return kda_set_error("nvml: nvmlInit_v2 failed");
  int dev = 0;
  cudaGetDevice(&dev);   /* NVML indexes may differ from CUDA's under CUDA_VISIBLE_DEVICES */
  if (U.handle((unsigned)dev, &U.dev) != 0) {
    U.shutdown();
    return kda_set_error("nvml: no handle for device %d", dev);
  }
  U.sum = 0;
  U.count = 0;
  U.running = 1;
  if (pthread_create(&U.thread, NULL, sampler, NULL)) {
    U.running = 0;
    U.shutdown();
    return kda_set_error("nvml: pthread_create failed");
  }
  return 0;
}

extern "C" int kda_cuda_util_stop(double *mean_pct) {
  if (!U.running) {
    if (mean_pct) *mean_pct = 0;
    return kda_set_error("nvml: the sampler is not running: call kda_cuda_util_start first");
  }
  U.running = 0;
  pthread_join(U.thread, NULL);
  U.shutdown();
  if (mean_pct) *mean_pct = U.count ? U.sum / (double)U.count : 0;
  return (int)U.count;
}
