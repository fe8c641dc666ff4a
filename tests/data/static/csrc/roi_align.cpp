#include <torch/extension.h>
#include <torch/library.h>

at::Tensor roi_align_forward_cuda(const at::Tensor& input);

at::Tensor roi_align_forward(const at::Tensor& input) {
  return roi_align_forward_cuda(input);
}

TORCH_LIBRARY(detops, m) {
  m.def("roi_align(Tensor input) -> Tensor");
  m.def("nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor");
}

TORCH_LIBRARY_IMPL(detops, CUDA, m) {
  m.impl("roi_align", &roi_align_forward);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("roi_align_forward", &roi_align_forward, "ROIAlign forward (CUDA)");
}
