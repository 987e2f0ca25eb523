/* kda_st16.cuh — whole-sector global stores of MMA accumulator fragments (standalone: the
 * wgmma kernels' kda_wgmma.cuh and the mma.sync kernels' kda_tile.cuh include it).
 * The fragment (mma.m16n8's C fragment, and a warpgroup MMA's, which is four of them a warp):
 * lane l holds rows row and row + 8 (row = its warp's first row + l / 4) at columns 8 j + 2 (l % 4),
 * + 1, of each 8-column block j, as d[4 j + q]: q = 0, 1 row row, q = 2, 3 row row + 8. */
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

/* a 16-byte global store, always one instruction: written as a uint4 through a pointer, the
 * front end splits it into four 4-byte stores wherever it cannot prove the address 16-byte
 * aligned (SASS of wip/wgs: 4 of its 12 wg_store_t stores stayed STG.E.128), and a warp's
 * 4-byte stores to 32 rows cost the kept forward ~600 us at (8,2048,16,128) (s43a) */
static __device__ __forceinline__ void stg16(void *p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
/* two floats as a bf16 pair (round to nearest), the low half the first */
static __device__ __forceinline__ uint32_t pk_bf2(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *(uint32_t *)&h;
}
/* A 16 x 32 block of that fragment (four 8-column blocks from column n0; row0 = the lane's
 * first row) to rows i < m in bf16, 16 bytes a lane (o: row i's column 0 at o + i rs, 16-byte
 * aligned), each value times sg. As one bf16 pair a block, a store of 4 bytes, a quad writes half
 * a 32-byte sector (rbf, the fiftieth pass: the rows kernel off its memory ceiling, 353.9 -> 386.2
 * us, for 21% fewer bytes). Here the quad transposes its 4 x 4 pairs first (lane t = l % 4 ends
 * with columns 8 t .. 8 t + 7 of each row: three exchanges, lane s sending its pair j = s ^ r in
 * round r) and stores them in one 16-byte store: a quad a row's 64 bytes, whole sectors */
static __device__ __forceinline__ void st_quad_b16(__nv_bfloat16 *o, int rs, const float (&d)[16], int row0, int n0,
                                                   int m, float sg) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int hf = 0; hf < 2; hf++) {                 /* rows row0, row0 + 8 */
    uint32_t pr[4], out[4];
#pragma unroll
    for (int j = 0; j < 4; j++) pr[j] = pk_bf2(sg * d[4 * j + 2 * hf], sg * d[4 * j + 2 * hf + 1]);
    auto pick = [&](int j) { return j == 0 ? pr[0] : j == 1 ? pr[1] : j == 2 ? pr[2] : pr[3]; };
#pragma unroll
    for (int j = 0; j < 4; j++) out[j] = pr[j];    /* out[t] = pr[t]; the rest below */
#pragma unroll
    for (int r = 1; r < 4; r++) {
      const uint32_t got = __shfl_xor_sync(0xffffffffu, pick(t ^ r), r);   /* lane t ^ r's pair t */
#pragma unroll
      for (int j = 0; j < 4; j++)
        if (j == (t ^ r)) out[j] = got;
    }
    const int i = row0 + 8 * hf;
    if (i < m) stg16(o + i * rs + n0 + 8 * t, out[0], out[1], out[2], out[3]);
  }
}
/* a warpgroup's 64 x 32 accumulator (rows 16 (warp % 4) + l / 4 ..) the same way */
static __device__ __forceinline__ void st_rows_b16(__nv_bfloat16 *o, int rs, const float (&d)[16], int n0, int m, float sg) {
  st_quad_b16(o, rs, d, 16 * ((threadIdx.x >> 5) & 3) + ((threadIdx.x & 31) >> 2), n0, m, sg);
}
