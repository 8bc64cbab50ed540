#pragma once

// The two strategies behind Gemm(), exposed so tests and benchmarks can drive each at any M.
// Both have Gemm()'s exact contract; Gemm() picks by layout and M.

#include <cstdint>
#include <functional>
#include <span>

#include "common/kernels/cpu/gemm.h"
#include "common/util/thread_pool.h"

namespace tandem::kernels::internal {

// Streams each weight row from memory once for all M rows of x. Best for small M (decode),
// where the weights' memory bandwidth is the limit. Row-major weights only.
void GemmStreaming(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w,
                   const float* bias, float* y, int64_t y_stride, ThreadPool& pool);

// GemmStreaming over several weights at once (see GemmMulti).
void GemmStreamingMulti(const float* x, int64_t m, int64_t x_stride,
                        std::span<const GemmOutput> outputs, ThreadPool& pool);

// Runs a register-blocked kernel over all M rows against each cache-sized block of weights:
// row-major weights are converted to f32 micro-panels once per block, panel weights are read in
// place. For row-major weights it is best at large M (prefill), where FMA throughput is the
// limit; panel weights take it at every M.
void GemmTiled(const float* x, int64_t m, int64_t x_stride, const WeightMatrix& w,
               const float* bias, float* y, int64_t y_stride, ThreadPool& pool);

// GemmTiled over several weights at once (see GemmMulti).
void GemmTiledMulti(const float* x, int64_t m, int64_t x_stride,
                    std::span<const GemmOutput> outputs, ThreadPool& pool);

// The work split of the slice-by-slice GEMMs (oneDNN's, the int8 tiles): runs fn(output, slice,
// r0, r1) over `pool` for every slice of `slice_rows` output rows of every output, rows [r0, r1)
// of x. Where there are fewer than two slices per thread and `split_rows`, x's m rows are split
// into parts too, each a whole number of runs of `unit_chunks` chunks of `chunk_rows` rows.
using SliceFn =
    std::function<void(const GemmOutput& output, int64_t slice, int64_t r0, int64_t r1)>;
void ForEachSlice(std::span<const GemmOutput> outputs, int64_t m, int64_t slice_rows,
                  int64_t chunk_rows, int64_t unit_chunks, bool split_rows, ThreadPool& pool,
                  const SliceFn& fn);

// Calls of more than one chunk of rows on the AMX tiles (prefill, and decode steps of 17-32 rows;
// the bf16 and the int8 kernels): items of (block of x's rows, slice of
// `slice_rows` output rows of an output) with the blocks outermost, so that both threads run every
// slice over the block their L2s hold (a tile load from L3 waits; one from L2 mostly does not).
// Blocks of whole `unit`s of rows, as even as they can be, of at most `max_block_rows` rows (at
// least one unit), and enough of them for two items per thread where m allows. Runs
// fn(output, slice, r0, r1, next_output, next_slice), where next is the slice of the item after
// it: the one the same thread most likely takes next (the pool hands out runs of consecutive
// items), which fn may ask into L2 ahead.
using RowBlockFn =
    std::function<void(const GemmOutput& output, int64_t slice, int64_t r0, int64_t r1,
                       const GemmOutput& next_output, int64_t next_slice)>;
void ForEachRowBlockSlice(std::span<const GemmOutput> outputs, int64_t m, int64_t slice_rows,
                          int64_t unit, int64_t max_block_rows, ThreadPool& pool,
                          const RowBlockFn& fn);

// Quantized panels run AVX-512 kernels where the CPU has AVX-512 (F, BW, VL, DQ), else AVX2;
// both give the same bits. Asks for one or the other (for tests and benchmarks) and returns
// whether AVX-512 is now used.
bool UseAvx512QuantKernels(bool use);

// Float weights (panels packed at load, read in place or converted to f32 for prefill, and
// row-major weights packed per call) run 16-lane kernels where the CPU has AVX-512, else 8-lane
// ones; both give the same bits. Asks for one or the other (tests, benchmarks); returns whether
// AVX-512 is now used.
bool UseAvx512PanelKernels(bool use);

// Quantized panels with int8 activations run integer kernels: AVX512-VNNI ones where the CPU
// has AVX512-VNNI and VBMI, else 256-bit ones on AVX2 (vpmaddubsw, or vpdpbusd where the CPU
// has AVX-VNNI); all give the same bits.
// Without them, the float kernels run on x rounded to int8 and back (the same products,
// rounded differently). Each asks for its kernels or not and returns whether they are now used (the
// AVX2 ones only where the AVX-512 ones are not; AVX-VNNI only in the AVX2 ones).
bool UseVnniQuantKernels(bool use);
bool UseAvx2IntegerQuantKernels(bool use);
bool UseAvxVnniIntegerQuantKernels(bool use);

}  // namespace tandem::kernels::internal
