/* ckpt.h — checkpoints as two safetensors files, and the few filesystem helpers runs need.
 * Also a LuaJIT ffi.cdef (after core/kda.h): lines starting with '#' are stripped.
 *
 * kda_ckpt_save(p, g, "runs/x/ckpt-100", meta) writes
 *   runs/x/ckpt-100.state.safetensors  every other persistent buffer (".adam_m", ".adam_v",
 *                                      "optim.state") — written first
 *   runs/x/ckpt-100.model.safetensors  the parameters only, f32, named as in the graph — written
 *                                      last, so its presence marks a complete checkpoint
 * Both carry __metadata__ {format "kda", step, data_seed, data_step, checksum "fnv1a64:<hex>" of
 * the tensor bytes}. Each file is written to <file>.tmp, fsynced, renamed, and the directory
 * fsynced: a crash leaves either the old files or the new ones, never a torn one.
 * kda_ckpt_load validates both files completely (size against header, header JSON, every
 * expected name with its dtype and shape, offsets, checksum, matching steps) before it writes
 * a single buffer, so a refused load leaves the plan as it was. */
#ifndef KDA_CKPT_H
#define KDA_CKPT_H
#include <stdint.h>
#include "kda.h"
#ifdef __cplusplus
extern "C" {
#endif

/* meta[]: what a checkpoint records besides the buffers (both files, as metadata strings). */
enum kda_ckpt_meta { KDA_CKPT_STEP = 0, KDA_CKPT_DATA_SEED = 1, KDA_CKPT_DATA_STEP = 2, KDA_CKPT_NMETA = 3 };

int kda_ckpt_save(kda_plan *p, const kda_graph *g, const char *prefix, const uint64_t *meta);
int kda_ckpt_load(kda_plan *p, const kda_graph *g, const char *prefix, uint64_t *meta_out);
/* The parameters only, from <prefix>.model.safetensors, into a plan that has no optimizer. */
int kda_ckpt_load_params(kda_plan *p, const kda_graph *g, const char *prefix, uint64_t *meta_out);
/* Steps of the checkpoints in dir (files ckpt-<step>.model.safetensors), ascending, at most max
 * into steps; returns how many there are (0 when dir does not exist). */
int kda_ckpt_list(const char *dir, int64_t *steps, int max);
int kda_mkdirs(const char *path);   /* mkdir -p; 0 or -1 */
int kda_isatty(int fd);             /* 1 when fd is a terminal */

#ifdef __cplusplus
}
#endif
#endif
