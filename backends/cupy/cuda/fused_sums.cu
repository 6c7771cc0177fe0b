// cupy-fused: per-cluster weighted sums and weights in 64-bit fixed point (two words per
// value, scaled per feature by a power of two, fixed_point_scales in stats.cu), so that
// atomics in any order give bit-identical sums; then finalize_sums turns them into float64.
// Labels int32; W null: unit weights. X is read as XT (default T; xhalf/xbf16: half X,
// widened exactly by xval), so the sums of half X are those of the same values in float.
#include "common.cuh"

// Shared-memory privatisation (k*(d+1) pairs of words per block), one point per thread,
// warp aggregation when a warp's points share a cluster; one flush per block.
template <typename T, typename XT = T>
__global__ void __launch_bounds__(BLOCK)
accumulate_shared(const XT* __restrict__ X, const T* __restrict__ W,
                  const int* __restrict__ labels, int n, int d, int k, u64* __restrict__ acc,
                  const double* __restrict__ scale, double two_l, const bool* __restrict__ skip) {
    if (skip != nullptr && *skip) return;  // an iteration the driver drops
    KMEANS_DYNAMIC_SMEM(unsigned char, smem);
    u64* sacc = reinterpret_cast<u64*>(smem);
    const int words = k * (d + 1) * 2;
    double* sscale = reinterpret_cast<double*>(sacc + words);
    for (int e = threadIdx.x; e < words; e += BLOCK) sacc[e] = 0ull;
    for (int j = threadIdx.x; j <= d; j += BLOCK) sscale[j] = scale[j];
    __syncthreads();
    for (i64 base = (i64)blockIdx.x * BLOCK; base < n; base += (i64)gridDim.x * BLOCK) {
        const i64 i = base + threadIdx.x;
        const bool valid = i < n;
        const int lab = valid ? labels[i] : -1;
        const T w = valid ? weight_at(W, i) : (T)0;
        const bool same = warp_same_label(lab, valid);
        const bool active = valid && w != (T)0;
        u64* dst = sacc + (size_t)(lab < 0 ? 0 : lab) * (d + 1) * 2;
        for (int j = 0; j <= d; ++j) {
            double v = 0.0;
            if (valid) v = j < d ? (double)xval<T>(X + i * d + j) * (double)w : (double)w;
            i64 hi, lo;
            to_fixed(v, sscale[j], two_l, hi, lo);
            warp_add_pair(dst + 2 * j, hi, lo, same, active);
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < words; e += BLOCK)
        if (sacc[e]) atomicAdd(acc + e, sacc[e]);
}

// Global atomics, one thread per (point, feature-or-weight) element, coalesced over X. Used
// when k*(d+1) does not fit in shared memory; still bit-reproducible (integer atomics).
template <typename T, typename XT = T>
__global__ void __launch_bounds__(BLOCK)
accumulate_global(const XT* __restrict__ X, const T* __restrict__ W,
                  const int* __restrict__ labels, int n, int d, u64* __restrict__ acc,
                  const double* __restrict__ scale, double two_l, const bool* __restrict__ skip) {
    if (skip != nullptr && *skip) return;  // an iteration the driver drops
    const i64 total = (i64)n * (d + 1);
    for (i64 e = (i64)blockIdx.x * BLOCK + threadIdx.x; e < total; e += (i64)gridDim.x * BLOCK) {
        const i64 i = e / (d + 1);
        const int j = (int)(e - i * (d + 1));
        const T w = weight_at(W, i);
        if (w == (T)0) continue;
        const double v = j < d ? (double)xval<T>(X + i * d + j) * (double)w : (double)w;
        i64 hi, lo;
        to_fixed(v, scale[j], two_l, hi, lo);
        add_pair(acc + ((i64)labels[i] * (d + 1) + j) * 2, hi, lo);
    }
}

// Sums in cluster order, where k*(d+1) pairs do not fit in shared memory: the rows are
// counting-sorted by label (sort_count, sort_offsets, sort_place: the order within a
// cluster is whatever the atomics give, which integer sums do not see), then
// accumulate_sorted walks them cluster by cluster, adding in registers and flushing a
// cluster's words once it ends: about k*(d+1)*2 atomics a pass where accumulate_global
// makes n*(d+1)*2 (258M at n=1M, d=128), on the same fixed-point words, so the same bits.

// The rows of a block: a contiguous run (sort_count and sort_place split n alike).
__device__ __forceinline__ void block_rows(int n, i64& lo, i64& hi) {
    const i64 per = ((i64)n + gridDim.x - 1) / gridDim.x;
    lo = (i64)blockIdx.x * per;
    hi = min((i64)n, lo + per);
}

// Each block's rows counted in shared memory (k_hist = k clusters' ints of dynamic shared
// memory, from the host when they fit), then added to `counts` once per non-empty cluster: a
// few global atomics per cluster and block instead of one per row on k contended counters.
// k_hist = 0: one global atomic per row.
__device__ __forceinline__ void count_block_rows(const int* __restrict__ labels, int n,
                                                 int k_hist, int* hist) {
    for (int c = threadIdx.x; c < k_hist; c += BLOCK) hist[c] = 0;
    __syncthreads();
    i64 lo, hi;
    block_rows(n, lo, hi);
    for (i64 i = lo + threadIdx.x; i < hi; i += BLOCK) atomicAdd(hist + labels[i], 1);
    __syncthreads();
}

__global__ void __launch_bounds__(BLOCK)
sort_count(const int* __restrict__ labels, int n, int* __restrict__ counts,
           const bool* __restrict__ skip, int k_hist) {
    if (skip != nullptr && *skip) return;
    if (k_hist == 0) {
        for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (i64)gridDim.x * BLOCK)
            atomicAdd(counts + labels[i], 1);
        return;
    }
    KMEANS_DYNAMIC_SMEM(int, hist);
    count_block_rows(labels, n, k_hist, hist);
    for (int c = threadIdx.x; c < k_hist; c += BLOCK)
        if (hist[c]) atomicAdd(counts + c, hist[c]);
}

// One block: starts[c] = the first sorted position of cluster c (starts[k] = n), cursor =
// starts (sort_place's insertion points); counts are read and zeroed for the next pass.
__global__ void __launch_bounds__(BLOCK)
sort_offsets(int* __restrict__ counts, int k, int* __restrict__ starts, int* __restrict__ cursor,
             const bool* __restrict__ skip) {
    if (skip != nullptr && *skip) return;
    __shared__ int part[BLOCK];
    const int per = (k + BLOCK - 1) / BLOCK;   // a contiguous run of clusters per thread
    const int lo = min(k, (int)threadIdx.x * per), hi = min(k, lo + per);
    int s = 0;
    for (int c = lo; c < hi; ++c) s += counts[c];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int o = 1; o < BLOCK; o <<= 1) {      // inclusive scan of the runs' totals
        const int v = threadIdx.x >= o ? part[threadIdx.x - o] : 0;
        __syncthreads();
        part[threadIdx.x] += v;
        __syncthreads();
    }
    int run = part[threadIdx.x] - s;
    for (int c = lo; c < hi; ++c) {
        const int m = counts[c];
        starts[c] = run;
        cursor[c] = run;
        counts[c] = 0;
        run += m;
    }
    if (threadIdx.x == BLOCK - 1) starts[k] = part[BLOCK - 1];
}

// order[cursor[label]++] = row. With k_hist (as sort_count's): each block counts its rows
// again, reserves each cluster's run of positions with one global atomic, and hands them out
// from shared memory.
__global__ void __launch_bounds__(BLOCK)
sort_place(const int* __restrict__ labels, int n, int* __restrict__ cursor,
           int* __restrict__ order, const bool* __restrict__ skip, int k_hist) {
    if (skip != nullptr && *skip) return;
    if (k_hist == 0) {
        for (i64 i = (i64)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (i64)gridDim.x * BLOCK)
            order[atomicAdd(cursor + labels[i], 1)] = (int)i;
        return;
    }
    KMEANS_DYNAMIC_SMEM(int, slot);
    count_block_rows(labels, n, k_hist, slot);
    for (int c = threadIdx.x; c < k_hist; c += BLOCK)
        if (slot[c]) slot[c] = atomicAdd(cursor + c, slot[c]);  // the block's first position
    __syncthreads();
    i64 lo, hi;
    block_rows(n, lo, hi);
    for (i64 i = lo + threadIdx.x; i < hi; i += BLOCK)
        order[atomicAdd(slot + labels[i], 1)] = (int)i;
}

__device__ __forceinline__ void flush_pair(u64* dst, u64& h, u64& l) {
    if (h) atomicAdd(dst, h);
    if (l) atomicAdd(dst + 1, l);
    h = 0ull;
    l = 0ull;
}

constexpr int SORTED_UNROLL = 4;  // rows whose loads are in flight at once, per thread

// Cluster c's sums of one thread (V features from g * V; with wcol the weights too) added to
// its fixed-point words, and zeroed.
template <int V>
__device__ __forceinline__ void flush_cluster(u64* acc, int c, int d, int g, bool feat,
                                              bool wcol, u64 (&h)[V], u64 (&l)[V], u64& wh,
                                              u64& wl) {
    u64* const row = acc + (i64)c * (d + 1) * 2;
    if (feat) {
#pragma unroll
        for (int v = 0; v < V; ++v) flush_pair(row + 2 * (g * V + v), h[v], l[v]);
    }
    if (wcol) flush_pair(row + 2 * d, wh, wl);
}

// V consecutive features of a row, one load (16 bytes when V > 1: the host passes V > 1 only
// where d is a multiple of V and X is 16-byte aligned). T is X's storage type: 16 bytes are
// 4 floats, 2 doubles or 8 xhalf / xbf16.
template <typename T, int V>
struct __align__(V > 1 ? 16 : sizeof(T)) RowPiece { T v[V]; };

// Block b sums sorted positions [b * rows_per_block, +rows_per_block): min(d / V, BLOCK)
// threads a row (V features each; the first also the weight), BLOCK / that rows at a time,
// each thread every R-th position, the next step's row indices loaded while this step's
// features are. Features beyond one block's threads take further sweeps.
template <typename T, int V, typename XT = T>
__global__ void __launch_bounds__(BLOCK)
accumulate_sorted(const XT* __restrict__ X, const T* __restrict__ W,
                  const int* __restrict__ order, const int* __restrict__ starts, int n, int d,
                  int k, int rows_per_block, u64* __restrict__ acc,
                  const double* __restrict__ scale, double two_l, const bool* __restrict__ skip) {
    if (skip != nullptr && *skip) return;
    typedef RowPiece<XT, V> Piece;  // X as stored
    const int pieces = d / V;
    const int lanes = pieces < BLOCK ? pieces : BLOCK;
    const int R = BLOCK / lanes;
    const int r0 = threadIdx.x / lanes;
    const int lane = threadIdx.x - r0 * lanes;
    const i64 lo = (i64)blockIdx.x * rows_per_block;
    const int hi = (int)min((i64)n, lo + rows_per_block);
    const i64 first64 = lo + r0;
    if (r0 >= R || first64 >= hi) return;
    const int first = (int)first64;
    int c0 = 0, top = k;   // the cluster holding `first`: starts[c0] <= first < starts[c0 + 1]
    while (top - c0 > 1) {
        const int mid = (c0 + top) >> 1;
        if (starts[mid] <= first) c0 = mid;
        else top = mid;
    }
    const double sw = scale[d];
    const int step = R * SORTED_UNROLL;
    for (int g0 = 0; g0 < pieces; g0 += lanes) {
        const int g = g0 + lane;                  // this thread's piece of the row
        const bool feat = g < pieces;
        const bool wcol = g0 == 0 && lane == 0;   // this thread also sums the weights
        double sj[V];
        u64 h[V], l[V];
#pragma unroll
        for (int v = 0; v < V; ++v) {
            sj[v] = feat ? scale[g * V + v] : 0.0;
            h[v] = 0ull;
            l[v] = 0ull;
        }
        u64 wh = 0ull, wl = 0ull;
        int c = c0, end = starts[c0 + 1];
        int row[SORTED_UNROLL];
#pragma unroll
        for (int u = 0; u < SORTED_UNROLL; ++u) {
            const int q = first + u * R;
            row[u] = q < hi ? order[q] : -1;
        }
        for (int p = first; p < hi; p += step) {
            Piece x[SORTED_UNROLL];
            T w[SORTED_UNROLL];
#pragma unroll
            for (int u = 0; u < SORTED_UNROLL; ++u) {
                if (row[u] >= 0 && feat) {
                    x[u] = reinterpret_cast<const Piece*>(X + (i64)row[u] * d)[g];
                } else {
#pragma unroll
                    for (int v = 0; v < V; ++v) x[u].v[v] = XT{};  // zero bits: 0
                }
                w[u] = row[u] >= 0 ? weight_at(W, row[u]) : (T)0;
            }
            int next[SORTED_UNROLL];              // the next step's rows, loading meanwhile
#pragma unroll
            for (int u = 0; u < SORTED_UNROLL; ++u) {
                const int q = p + step + u * R;
                next[u] = q < hi ? order[q] : -1;
            }
#pragma unroll
            for (int u = 0; u < SORTED_UNROLL; ++u) {
                const int q = p + u * R;
                if (row[u] < 0) continue;
                if (q >= end) {   // cluster c ended: add its words, move to q's cluster
                    flush_cluster<V>(acc, c, d, g, feat, wcol, h, l, wh, wl);
                    do { ++c; } while (starts[c + 1] <= q);
                    end = starts[c + 1];
                }
                i64 fh, fl;
                if (feat) {
#pragma unroll
                    for (int v = 0; v < V; ++v) {
                        // (X as stored until here: the loads of the SORTED_UNROLL rows
                        // are issued together, then each value is widened exactly)
                        const double xv = (double)xval<T>(x[u].v + v);
                        to_fixed(xv * (double)w[u], sj[v], two_l, fh, fl);
                        h[v] += (u64)fh;
                        l[v] += (u64)fl;
                    }
                }
                if (wcol) {
                    to_fixed((double)w[u], sw, two_l, fh, fl);
                    wh += (u64)fh;
                    wl += (u64)fl;
                }
            }
#pragma unroll
            for (int u = 0; u < SORTED_UNROLL; ++u) row[u] = next[u];
        }
        flush_cluster<V>(acc, c, d, g, feat, wcol, h, l, wh, wl);
    }
}

// Fixed point -> float64 sums (k, d) and weights (k), zeroing the accumulator for the next
// pass. Block 0 also writes the pass's statistics: stats[0] = the fixed-order sum of the
// assignment's per-block inertia partials (when n_partials > 0), stats[1] = the labels
// changed (*counter, then reset to 0; or changed_if_none when it is >= 0: no old labels).
// A batch of `problems` (their clusters one after another in acc): block p writes problem
// p's statistics into stats[2p], stats[2p + 1], from its n_partials partials and counter
// (the grid has at least `problems` blocks).
__global__ void __launch_bounds__(BLOCK)
finalize_sums(u64* __restrict__ acc, int k, int d, const double* __restrict__ inv_scale,
              double inv_two_l, double* __restrict__ sums, double* __restrict__ weights,
              const double* __restrict__ block_inertia, int n_partials,
              u64* __restrict__ counter, double changed_if_none, double* __restrict__ stats,
              int problems) {
    __shared__ double red[WARPS];
    const i64 total = (i64)k * (d + 1);
    for (i64 e = (i64)blockIdx.x * BLOCK + threadIdx.x; e < total; e += (i64)gridDim.x * BLOCK) {
        const i64 c = e / (d + 1);
        const int j = (int)(e - c * (d + 1));
        const i64 hi = (i64)acc[2 * e], lo = (i64)acc[2 * e + 1];
        acc[2 * e] = 0ull;
        acc[2 * e + 1] = 0ull;
        const double v = (__ll2double_rn(hi) + __ll2double_rn(lo) * inv_two_l) * inv_scale[j];
        if (j < d) sums[c * d + j] = v;
        else weights[c] = v;
    }
    const int p = blockIdx.x;
    if (p < problems && n_partials > 0) {
        const double tot = block_sum_partials(block_inertia + (i64)p * n_partials, n_partials,
                                              red);
        if (threadIdx.x == 0) {
            stats[2 * p] = tot;
            stats[2 * p + 1] = changed_if_none >= 0.0 ? changed_if_none : (double)counter[p];
            counter[p] = 0ull;
        }
    }
}
