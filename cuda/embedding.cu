// embedding.cu: token embedding gather.
//
// Computes   out[i, :] = float(table[ids[i], :])     i in [0, n_rows)
//
// Layouts:   table [vocab, hidden] row-major, bf16 bits (uint16) or float32
//            ids   [n_rows] int32 in device memory (the decode step points it at
//                  the control block's CTL_TOKEN, written by argmax on the device)
//            out   [n_rows, hidden] float32 row-major
// Launch:    grid (n_rows), block 256; no shared memory.
//            May be launched programmatically (griddep_wait before the first dependent read).
// Preconditions: none on sizes. An id outside [0, vocab) writes a NaN row, so a
//            bad token is loud downstream instead of silently reading another row.
#include "common.cuh"

template <typename T> __device__ __forceinline__ float load_elem(const T* p, size_t i);
template <> __device__ __forceinline__ float load_elem<uint16_t>(const uint16_t* p, size_t i) { return bf16_bits_to_float(p[i]); }
template <> __device__ __forceinline__ float load_elem<float>(const float* p, size_t i) { return p[i]; }

template <typename T>
__device__ void gather_rows(const T* table, const int* ids, float* out, int hidden, int vocab) {
    griddep_wait();                                   // a decode step's id is the previous step's argmax
    griddep_launch_dependents();
    const int row = blockIdx.x;                       // range [0, n_rows)
    const int id = ids[row];
    float* dst = out + (size_t)row * hidden;
    if (id < 0 || id >= vocab) {
        for (int d = threadIdx.x; d < hidden; d += blockDim.x) dst[d] = __int_as_float(0x7fc00000);
        return;
    }
    const size_t base = (size_t)id * hidden;
    for (int d = threadIdx.x; d < hidden; d += blockDim.x)   // d range [0, hidden)
        dst[d] = load_elem<T>(table, base + d);
}

extern "C" __global__ void embed_gather_bf16(const uint16_t* table, const int* ids, float* out, int hidden, int vocab) {
    gather_rows<uint16_t>(table, ids, out, hidden, vocab);
}

extern "C" __global__ void embed_gather_f32(const float* table, const int* ids, float* out, int hidden, int vocab) {
    gather_rows<float>(table, ids, out, hidden, vocab);
}
