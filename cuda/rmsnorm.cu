// rmsnorm.cu: RMSNorm of rows of the residual stream, fused with initialising
// the accumulator the next projection adds into.
//
// Computes   out[i, :] = x[i, :] * rsqrt(mean(x[i, :]^2) + eps) * w[:]       (fp32, as HF)
//            and, when init_dst != NULL,
//            init_dst[i, c] = init_src ? init_src[c] : 0       c in [0, init_cols)
// The residual add itself happens in the projections (their epilogue adds into
// the residual stream), so x here already holds residual + sublayer output.
// The init half exists because the q/k/v projection is split over K and
// accumulates with atomics: its output must start as the bias.
//
// Layouts:   x, out [n_rows, hidden] float32 row-major; w [hidden] float32;
//            init_dst [n_rows, init_cols] float32; init_src [init_cols] float32 or NULL.
// Launch:    grid (n_rows), block 256 (a multiple of 32); 32 floats of shared memory.
// Preconditions: x and out may not overlap unless equal row pointers are acceptable
//            (each thread reads its elements before the block-wide sum, writes after).
#include "common.cuh"

extern "C" __global__ void rmsnorm_rows(const float* x, const float* w, float* out, int hidden, float eps,
                                        float* init_dst, const float* init_src, int init_cols) {
    __shared__ float scratch[32];
    const int row = blockIdx.x;                       // range [0, n_rows)
    const float* xr = x + (size_t)row * hidden;
    const float inv = row_inv_rms(xr, hidden, eps, scratch);
    float* orow = out + (size_t)row * hidden;
    for (int d = threadIdx.x; d < hidden; d += blockDim.x) orow[d] = w[d] * (xr[d] * inv);
    if (init_dst != nullptr) {
        float* irow = init_dst + (size_t)row * init_cols;
        for (int c = threadIdx.x; c < init_cols; c += blockDim.x)   // c range [0, init_cols)
            irow[c] = init_src ? init_src[c] : 0.f;
    }
}
