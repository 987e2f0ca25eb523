/* ops.h — the op table: names and shape inference, shared by graphs and eager tensors. */
#ifndef KDA_OPS_H
#define KDA_OPS_H
#include "kda.h"

/* RoPE head dims are limited so the CPU op keeps its angle table on the stack. */
#define KDA_ROPE_MAX_DH 1024

/* What shape inference sees of a tensor. */
typedef struct kda_desc {
  int32_t dtype, ndim;
  int64_t shape[4];
} kda_desc;

/* Output descriptor of op applied to in[0..nin); -1 + error naming the op and shapes. */
int kda_op_infer(int op, int nin, const kda_desc *in, const int64_t *iattr, const float *fattr,
                 kda_desc *out);
int64_t kda_desc_numel(const kda_desc *d);
/* "[2,3,4]" into buf (for error messages). */
const char *kda_desc_str(const kda_desc *d, char *buf, size_t n);
#endif
