// Checks of packed weights at the Python boundary, shared by the binding files (binding.cpp's gemm entry
// points, decoder_binding.cpp's projections): every array a kernel will trust is checked against the
// shape, group and width it claims, with a ValueError naming the argument.
#pragma once
#include <nanobind/nanobind.h>

#include <cstdint>
#include <shared_mutex>
#include <string>
#include <utility>

#include "codebook.h"
#include "common.h"
#include "tq1.h"

namespace lowbit::py {

namespace nb = nanobind;

// Kernel calls hold the settings lock shared while they run (set_isa / set_threads wait for them).
using KernelsRunning = std::shared_lock<std::shared_mutex>;

// int32 accumulators sum group products of (code <= max_code) x (|q| <= 127): must stay below 2^31.
void check_accumulator_bound(const char* fn, int64_t group, int64_t max_code);

// One packed integer-code weight, checked against its M, Kp, group and width: every entry point that
// takes one (gemm_int, gemm_int_multi, bench_int, the decoder's projections) builds it here.
IntWeights checked_int_weights(const char* fn, nb::handle hcodes, nb::handle hscale, nb::handle hoffset, float zc,
                               int bits, int64_t M, int64_t Kp, int64_t group);

// One tq1 weight (tq1.h), checked against its M, Kp and group.
TQ1Weights checked_tq1_weights(const char* fn, nb::handle hcodes, nb::handle hscale, int64_t M, int64_t Kp, int64_t group);

// A float weight [M, K]: float32, or bf16 bits as uint16. Returns (weights, is_bf16).
std::pair<FloatWeights, bool> checked_float_weights(const char* fn, nb::handle h);

// One codebook weight (codebook.h): codes u8 [Mt*Kp/v*m*8], scale f16-as-u16 [G*Mt*8], codebooks cbT f32
// [m][v][nc] and cb f32 [m][nc][v] (cbT transposed), checked against M, Kp and group; codes16: None or, for b = 4,
// the AVX-512 layout's copy of the codes (codebook.h).
CodebookWeights checked_codebook_weights(const char* fn, nb::handle hcodes, nb::handle hscale, nb::handle hcbT,
                                         nb::handle hcb, int64_t M, int64_t Kp, int64_t group,
                                         nb::handle hcodes16 = nb::none());

}  // namespace lowbit::py
