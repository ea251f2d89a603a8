#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

void launch_axpy(const float* a, const float* b, float* c, float alpha, long n, cudaStream_t s);

torch::Tensor axpy(torch::Tensor a, torch::Tensor b, double alpha) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda(), "axpy: inputs must be CUDA tensors");
  TORCH_CHECK(a.scalar_type() == torch::kFloat && b.scalar_type() == torch::kFloat,
              "axpy: inputs must be float32");
  TORCH_CHECK(a.sizes() == b.sizes(), "axpy: shapes differ");
  auto ac = a.contiguous();
  auto bc = b.contiguous();
  auto c = torch::empty_like(ac);
  launch_axpy(ac.data_ptr<float>(), bc.data_ptr<float>(), c.data_ptr<float>(),
              static_cast<float>(alpha), ac.numel(), c10::cuda::getCurrentCUDAStream());
  return c;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("axpy", &axpy, "a + alpha * b"); }
