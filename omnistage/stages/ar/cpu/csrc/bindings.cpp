// The Python module of the AR engine's native kernels (native.py builds it from every .cpp here).

#include <torch/extension.h>

#include <tuple>

void paged_decode(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                  torch::Tensor rows, torch::Tensor slots, torch::Tensor lens, double scale);
void write_cache(torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slots, torch::Tensor k,
                 torch::Tensor v);
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(torch::Tensor h, torch::Tensor y, torch::Tensor weight,
                                                      double eps);
void rotary_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, int64_t heads, int64_t dim);
torch::Tensor silu_mul(torch::Tensor gate_up);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "decode attention from the paged KV cache, written into out");
  m.def("write_cache", &write_cache, "this step's keys and values into their cache slots");
  m.def("rms_norm", &rms_norm, "RMS norm of each row");
  m.def("add_rms_norm", &add_rms_norm, "(h + y, RMS norm of h + y)");
  m.def("rotary_", &rotary_, "rotary embedding in place on the first heads of each row");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of a packed gate/up projection");
}
