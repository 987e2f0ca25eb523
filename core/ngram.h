/* ngram.h — byte n-gram baselines (orders 1..8) and compressor anchors: the bars every model
 * must beat. Also a LuaJIT ffi.cdef (after data.h): lines starting with '#' are stripped.
 *
 *   m = kda_ngram_train_domain(d, i, 8, 0)            -- count once, up to order 8
 *   kda_ngram_bpb_orders(m, KDA_NGRAM_KN, d, i, 0, bpb)   -- bpb[k-1] for orders 1..8
 *
 * One training pass counts every n-gram of orders 1..max_order in open-addressing hash tables
 * keyed by the packed n-gram (8 bytes fit a uint64); a second pass derives per-context statistics
 * for all methods, so any (method, order <= max_order) can be evaluated from one model.
 * Methods (each a proper distribution over the 256 bytes, base case uniform 1/256):
 *   BACKOFF  absolute-discount back-off (Katz-like): seen bytes get (c-D)/c(h), unseen bytes share
 *            D*N1+(h)/c(h) in proportion to the lower order; D = n1/(n1+2 n2) per order, and D = 0
 *            where all 256 bytes were seen. Order 1 with every byte seen is the ML unigram.
 *   KN       interpolated modified Kneser-Ney (Chen & Goodman 1998): three discounts per order,
 *            continuation counts N1+(. h w) below the top order.
 *   PPM      PPM-C escape counts blended with the lower order (= Witten-Bell interpolation):
 *            P = (c(hw) + u P_lower)/(c(h) + u), u = distinct followers; no exclusion.
 * A context seen in training uses its statistics; an unseen one passes the lower order through.
 * BPB is measured on the domain's held-out window through kda_data_window_seq (data.h), the same
 * sequences the trainer evaluates: the context of a target never reaches across the start of its
 * sequence (seq_len <= 0 means one sequence per window, i.e. full context). */
#ifndef KDA_NGRAM_H
#define KDA_NGRAM_H
#include <stdint.h>
#include "data.h"
#ifdef __cplusplus
extern "C" {
#endif

typedef struct kda_ngram kda_ngram;
enum kda_ngram_method { KDA_NGRAM_BACKOFF = 0, KDA_NGRAM_KN = 1, KDA_NGRAM_PPM = 2, KDA_NGRAM_NMETHODS = 3 };
const char *kda_ngram_method_name(int method);   /* "backoff", "kn", "ppm"; NULL if unknown */

/* Count bytes[0..n) (caller keeps ownership) up to max_order (1..8). NULL on error. */
kda_ngram *kda_ngram_train(const uint8_t *bytes, int64_t n, int max_order);
/* Train on domain i's training bytes: the last max_bytes before its window (0 = all of them). */
kda_ngram *kda_ngram_train_domain(const kda_data *d, int i, int max_order, int64_t max_bytes);
void kda_ngram_free(kda_ngram *m);

int kda_ngram_max_order(const kda_ngram *m);
int64_t kda_ngram_trained_bytes(const kda_ngram *m);
int64_t kda_ngram_entries(const kda_ngram *m, int order);   /* distinct n-grams of that order */
int64_t kda_ngram_count(const kda_ngram *m, const uint8_t *gram, int n); /* raw count of gram[0..n) */
int64_t kda_ngram_memory_bytes(const kda_ngram *m);          /* all tables, as allocated */
double kda_ngram_count_seconds(const kda_ngram *m);          /* the counting pass alone */
double kda_ngram_stats_seconds(const kda_ngram *m);          /* the statistics pass */

/* P(byte | ctx) of one (method, order): ctx[0..ctx_len) are the preceding bytes, the last one
 * nearest (only the last order-1 matter). Returns the probability, -1 on error. */
double kda_ngram_prob(const kda_ngram *m, int method, int order, const uint8_t *ctx, int64_t ctx_len,
                      int byte);
/* The whole distribution: out[256] (caller-owned) = P(b | ctx) for b = 0..255. 0 or -1. */
int kda_ngram_dist(const kda_ngram *m, int method, int order, const uint8_t *ctx, int64_t ctx_len,
                   double *out);
/* Total bits of bytes[0..n), each byte given all bytes before it in the array. -1 on error. */
double kda_ngram_bits(const kda_ngram *m, int method, int order, const uint8_t *bytes, int64_t n);
/* Bits per byte on domain i's held-out window, sequences of seq_len (<= 0: one sequence). -1 on error. */
double kda_ngram_bpb(const kda_ngram *m, int method, int order, const kda_data *d, int i, int64_t seq_len);
/* Same for every order at once: bpb[k-1] for k = 1..max_order (caller-owned array). 0 or -1. */
int kda_ngram_bpb_orders(const kda_ngram *m, int method, const kda_data *d, int i, int64_t seq_len,
                         double *bpb);

/* ---- compressor anchors (core/anchor.c) -------------------------------------------------------
 * Adaptive compressors run as child processes: tool is "xz" (xz -9e), "zstd" (zstd -19 --long=27)
 * or "ppmd" (7z a -m0=PPMd -mx=9). The cost of x given ctx is bits(ctx + x) - bits(ctx). */
int kda_anchor_available(const char *tool);                  /* 1 if the program runs, else 0 */
/* Conditional bits of x[0..nx) after ctx[0..nctx); -1 on error (a missing tool says which package). */
double kda_anchor_bits(const char *tool, const uint8_t *ctx, int64_t nctx, const uint8_t *x, int64_t nx);
/* Bits per byte of domain i's window given the last tail_bytes training bytes before it. -1 on error. */
double kda_anchor_bpb(const char *tool, const kda_data *d, int i, int64_t tail_bytes);

#ifdef __cplusplus
}
#endif
#endif
