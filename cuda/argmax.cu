// argmax.cu: greedy choice restricted to the action-bin token ids, on the device.
//
// Computes   b* = argmax_b logits[b], b in [0, n_bins) (lowest b on ties, as np.argmax);
//            token = bin_lo + b*, or -1 when any logit is NaN/Inf (the host turns -1 into an
//            error naming the step instead of acting on garbage). Then, by thread 0:
//            tokens_out[ctl[CTL_N_OUT]] = token; ctl[CTL_N_OUT] += 1; ctl[CTL_TOKEN] = token;
//            ctl[CTL_ROW_OFFSET] += rows_consumed   (so the next captured step reads its row)
// Layouts:   logits [n_bins] float32 (the head was evaluated on the bin rows only);
//            tokens_out [max tokens] int32; ctl: control block (common.cuh).
// Launch:    grid (1), block 256; 256 floats + 256 ints of shared memory.
//            May be launched programmatically (griddep_wait before the first dependent read).
#include "common.cuh"

#define ARGMAX_THREADS 256

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax_bins(
        const float* logits, int n_bins, int bin_lo, int* ctl, int* tokens_out, int rows_consumed) {
    __shared__ float best_v[ARGMAX_THREADS];
    __shared__ int best_i[ARGMAX_THREADS];
    __shared__ int bad;
    griddep_wait();                                   // the logits come from the head projection
    griddep_launch_dependents();
    if (threadIdx.x == 0) bad = 0;
    __syncthreads();
    float v = -INFINITY;
    int idx = 0x7fffffff;
    for (int b = threadIdx.x; b < n_bins; b += ARGMAX_THREADS) {   // b range [0, n_bins)
        const float x = logits[b];
        if (!isfinite(x)) bad = 1;
        if (x > v || (x == v && b < idx)) { v = x; idx = b; }
    }
    best_v[threadIdx.x] = v;
    best_i[threadIdx.x] = idx;
    __syncthreads();
    for (int stride = ARGMAX_THREADS / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            const float ov = best_v[threadIdx.x + stride];
            const int oi = best_i[threadIdx.x + stride];
            if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const int token = (bad || best_i[0] >= n_bins) ? -1 : bin_lo + best_i[0];
        tokens_out[ctl[CTL_N_OUT]] = token;
        ctl[CTL_N_OUT] += 1;
        ctl[CTL_TOKEN] = token;
        ctl[CTL_ROW_OFFSET] += rows_consumed;
    }
}
