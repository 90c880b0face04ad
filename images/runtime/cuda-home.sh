#!/bin/sh
# A CUDA_HOME for the runtime's JIT kernels (sglang.kernels.jit, the HiCache host<->GPU transfers among them), made
# of the lock's nvidia-* wheels. sglang compiles with $CUDA_HOME/bin/nvcc and links -L$CUDA_HOME/lib64 -lcudart; the
# wheels hold nvidia/cu13/{bin,include,nvvm,lib} with lib/libcudart.so.13 only, so that link fails without this
# (measured on an H200, 2026-12-05); the runtime then falls back to sgl_kernel's transfer, at 0.20x of the pinned
# copy against the JIT kernel's 0.89x (bench/gpu_engine.md).
#   cuda-home.sh SITE_PACKAGES DEST      # then CUDA_HOME=DEST
set -eu
site=$1
dest=$2
nv="$site/nvidia/cu13"
# curand.h: flashinfer's sampling kernels include it; cublasLt.h: flashinfer's norm module (sgl_kernel's gemma_rmsnorm
# goes through it where flashinfer imports; built during the MTP draft's CUDA-graph capture) includes it through
# trtllm/common/cudaUtils.h, and its build failing ends the server at start (measured on an H100, 2026-12-07).
for need in bin/nvcc nvvm/bin/cicc include/cuda_runtime.h include/crt include/cccl include/curand.h include/cublasLt.h \
        lib/libcudart.so.13; do
    if [ ! -e "$nv/$need" ]; then
        echo "cuda-home: $nv/$need is missing (the lock's nvidia-cuda-nvcc/-crt/-cccl/-runtime, nvidia-nvvm, nvidia-curand and nvidia-cublas)" >&2
        exit 1
    fi
done
mkdir -p "$dest/lib64"
for d in bin include nvvm; do
    ln -sfn "$nv/$d" "$dest/$d"
done
ln -sfn "$nv/lib/libcudart.so.13" "$dest/lib64/libcudart.so"
echo "cuda-home: $dest -> $nv"
