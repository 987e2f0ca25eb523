/* data.h — byte corpora: domains, the training sampler, held-out windows.
 * Also a LuaJIT ffi.cdef: lines starting with '#' are stripped, the rest is plain C.
 *
 * A domain is one byte string: a file (memory-mapped) or a folder (every regular file under it,
 * sorted by path under strcmp, concatenated). Bytes are tokens: token = byte value, 0..255.
 *
 *   d = kda_data_open(2, paths, names, weights)      -- or kda_data_open_manifest("data/small", ...)
 *   kda_data_start(d, B, T, seed, 1)                  -- sampler over the weighted mixture
 *   loop: kda_data_next_batch(d, tokens, targets)     -- int32 [B,T] each; target = next byte
 *   for k in 0..kda_data_window_count(d, i, T)-1: kda_data_window_seq(d, i, T, k, x, y)
 *
 * Held-out window of a domain of S bytes: the last W bytes, W = min(1 MiB, floor(S/10)) unless
 * kda_data_set_window overrides it. Training targets are drawn only from bytes [0, S-W), so no
 * window byte is ever a training target; the window depends on nothing but S.
 * Window sequence k (seq_len T) has targets at bytes [s, s+T) with s = min(S-W + k*T, S-T); its
 * inputs are the bytes one to the left. Targets before S-W + k*T were counted by sequence k-1
 * (or are training bytes serving as context), so kda_data_window_seq returns the index of the
 * first counted target: summing the losses of positions >= that index over all sequences counts
 * every window byte exactly once. The n-gram bars (ngram.h) use this same function.
 *
 * Sampler: batch number s is a pure function of (seed, s): row r picks a domain with probability
 * weight/sum(weights), then a uniform offset o in [0, S-W-T-1]; tokens = bytes[o, o+T),
 * targets = bytes[o+1, o+T+1). The state {seed, step} is all a checkpoint needs.
 * A prefetch thread computes batch s+1 while the caller uses batch s (double buffer). */
#ifndef KDA_DATA_H
#define KDA_DATA_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct kda_data kda_data;
typedef void *(*kda_host_alloc_fn)(int64_t bytes);   /* batch buffers; a CUDA build passes pinned */
typedef void (*kda_host_free_fn)(void *p);

/* ---- open / close ---------------------------------------------------------------------- */
/* n domains; paths[i] a file or folder; names[i] may be NULL (then the file name without its
 * extension); weights may be NULL (all 1). The handle owns everything; NULL on error. */
kda_data *kda_data_open(int n, const char *const *paths, const char *const *names,
                        const double *weights);
/* Open domains listed in dir/MANIFEST (written by vendor/data.sh) after checking the manifest
 * parses and each file has the size it states. names: n domain names, or n = 0 for all of them
 * (weights then ignored, all 1). NULL on error. */
kda_data *kda_data_open_manifest(const char *dir, int n, const char *const *names,
                                 const double *weights);
void kda_data_free(kda_data *d);                       /* stops the prefetch thread; NULL is fine */

/* ---- domains --------------------------------------------------------------------------- */
int kda_data_ndomains(const kda_data *d);
const char *kda_data_domain_name(const kda_data *d, int i);   /* owned by d */
int64_t kda_data_domain_bytes(const kda_data *d, int i);      /* S; -1 on bad i */
const uint8_t *kda_data_domain_ptr(const kda_data *d, int i); /* S bytes, owned by d, read-only */
double kda_data_domain_weight(const kda_data *d, int i);
int kda_data_set_weight(kda_data *d, int i, double w);        /* before kda_data_start */

/* ---- held-out windows ---------------------------------------------------------------------- */
int64_t kda_data_window_start(const kda_data *d, int i);      /* S-W = bytes available to train */
int64_t kda_data_window_bytes(const kda_data *d, int i);      /* W */
int kda_data_set_window(kda_data *d, int i, int64_t bytes);   /* override W (1..S-2), before start */
int64_t kda_data_window_count(const kda_data *d, int i, int64_t seq_len); /* ceil(W/T); -1 error */
/* Sequence k of the window: input[T], target[T] int32 (caller-owned). Returns the index of the
 * first target counted in this sequence (0 except possibly the last), -1 on error. */
int64_t kda_data_window_seq(const kda_data *d, int i, int64_t seq_len, int64_t k, int32_t *input,
                            int32_t *target);
/* Rows first_seq..first_seq+B-1 into input/target [B,T]; mask [B,T] f32 (may be NULL) is 1 where
 * the target is counted. Rows past the last sequence are copies with mask 0. Returns the number
 * of real rows (0..B), -1 on error. */
int64_t kda_data_window_batch(const kda_data *d, int i, int64_t seq_len, int64_t batch,
                              int64_t first_seq, int32_t *input, int32_t *target, float *mask);

/* ---- training sampler ------------------------------------------------------------------- */
/* Batch buffers come from alloc/free (NULL, NULL = malloc/free). Call before kda_data_start. */
int kda_data_set_allocator(kda_data *d, kda_host_alloc_fn alloc, kda_host_free_fn free_fn);
/* Fix the batch shape [B,T] and seed, step = 0; prefetch = 1 starts the prefetch thread. */
int kda_data_start(kda_data *d, int64_t batch, int64_t seq_len, uint64_t seed, int prefetch);
/* Next batch: copies into tokens/targets [B,T] int32 when they are not NULL. Either way the batch
 * stays readable at kda_data_batch_tokens/targets until the next call. 0 or -1. */
int kda_data_next_batch(kda_data *d, int32_t *tokens, int32_t *targets);
const int32_t *kda_data_batch_tokens(const kda_data *d);   /* [B,T], owned by d; NULL before */
const int32_t *kda_data_batch_targets(const kda_data *d);  /* [B,T], owned by d; NULL before */
const int32_t *kda_data_batch_domains(const kda_data *d);  /* [B] domain of each row */
/* Sampler state for checkpoints: state[0] = seed, state[1] = step (batches delivered). */
int kda_data_get_state(const kda_data *d, uint64_t *state);
int kda_data_set_state(kda_data *d, const uint64_t *state); /* next batch is number state[1] */

#ifdef __cplusplus
}
#endif
#endif
