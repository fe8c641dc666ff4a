"""Builds the detection ops extension (CUDA only)."""
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    name="detops",
    ext_modules=[
        CUDAExtension(
            name="detops._C",
            sources=["csrc/roi_align.cpp", "csrc/roi_align_kernel.cu"],
            extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "--use_fast_math"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
