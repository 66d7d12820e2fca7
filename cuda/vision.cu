// vision.cu: the vision encoder's patch projection and the pooled-embedding similarity used
// by semantic eviction, on the device (no host round trip per eviction).
//
// patch_embed: image [Hi, Wi, 3] uint8 RGB at the encoder size (already resized), p = patch:
//            patch t = r*cols + c, flat[(y*p + x)*3 + ch] = image[r*p + y, c*p + x, ch] / 127.5 - 1
//            tokens[t, o] = sum_f W[o, f] * flat[f] + bias[o]        (fp32)
//            Launch: grid (n_tokens, ceil_div(hidden, 8)), block 256 = 8 warps; warp w owns output
//            o = blockIdx.y*8 + w; the patch (3*p*p floats) is staged in shared memory
//            (dynamic, 3*p*p floats).
// pool_rows: pooled[o] = mean_t tokens[t, o]. Launch: grid ceil_div(hidden, 256), block 256.
// adjacent_cosine: sims[i] = <P[i], P[i+1]> / (|P[i]| |P[i+1]|), 0 when a norm is 0
//            (as core/kv_slots.adjacent_cosine_similarities). P [n, hidden] float32.
//            Launch: grid (n - 1), block 256; 96 floats of shared memory.
// Layouts:   W [hidden, 3*p*p] float32 row-major (patch_proj.weight), bias [hidden].
#include "common.cuh"

extern "C" __global__ void patch_embed(const unsigned char* image, int width, int grid_cols, int patch,
                                       const float* W, const float* bias, float* tokens, int hidden) {
    extern __shared__ float flat[];
    const int t = blockIdx.x;                                   // range [0, rows*cols)
    const int r = t / grid_cols, c = t - r * grid_cols;
    const int patch_dim = 3 * patch * patch;
    for (int f = threadIdx.x; f < patch_dim; f += blockDim.x) {   // f range [0, 3*p*p)
        const int ch = f % 3, yx = f / 3, y = yx / patch, x = yx - y * patch;
        const unsigned char px = image[((size_t)(r * patch + y) * width + (c * patch + x)) * 3 + ch];
        flat[f] = (float)px / 127.5f - 1.f;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int o = blockIdx.y * 8 + (threadIdx.x >> 5);          // range [0, hidden)
    if (o >= hidden) return;
    const float* w = W + (size_t)o * patch_dim;
    float s = 0.f;
    for (int f = lane; f < patch_dim; f += 32) s += w[f] * flat[f];
    s = warp_sum(s);
    if (lane == 0) tokens[(size_t)t * hidden + o] = s + bias[o];
}

extern "C" __global__ void pool_rows(const float* tokens, int n_tokens, int hidden, float* pooled) {
    const int o = blockIdx.x * blockDim.x + threadIdx.x;        // range [0, hidden)
    if (o >= hidden) return;
    float s = 0.f;
    for (int t = 0; t < n_tokens; ++t) s += tokens[(size_t)t * hidden + o];
    pooled[o] = s / (float)n_tokens;
}

extern "C" __global__ void adjacent_cosine(const float* P, int hidden, float* sims) {
    __shared__ float scratch[32];
    const int i = blockIdx.x;                                   // range [0, n-1)
    const float* a = P + (size_t)i * hidden;
    const float* b = a + hidden;
    float dot = 0.f, na = 0.f, nb = 0.f;
    for (int d = threadIdx.x; d < hidden; d += blockDim.x) {    // d range [0, hidden)
        dot += a[d] * b[d];
        na += a[d] * a[d];
        nb += b[d] * b[d];
    }
    dot = block_sum(dot, scratch);
    na = block_sum(na, scratch);
    nb = block_sum(nb, scratch);
    if (threadIdx.x == 0) {
        const float norms = sqrtf(na) * sqrtf(nb);
        sims[i] = norms > 0.f ? dot / norms : 0.f;
    }
}
