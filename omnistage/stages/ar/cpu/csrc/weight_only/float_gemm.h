// Float32 linears summed in oneDNN's order (float_gemm.cpp).
#pragma once

#include <torch/extension.h>

namespace float_gemm {

// w [N, K] float32 -> its panels [ceil(N / 8), K, 8] (eight output features side by side, zero-padded).
torch::Tensor pack(const torch::Tensor& w);

// x [rows, K] @ W.T (+ bias) for W packed by `pack` (n: W's rows, the output width), summed over k in
// blocks of `block_k` (float_gemm.cpp).
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& panels, int64_t n,
                     const c10::optional<torch::Tensor>& bias, int64_t block_k);

}  // namespace float_gemm
