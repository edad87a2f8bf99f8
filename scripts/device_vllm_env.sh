# Sourced by the device batch scripts that use the carried vLLM GPU build: the repository root as the working
# directory, the environment every vLLM server and rank there needs (NVLink multicast off, FlashInfer's sampler off:
# FlashInfer is not carried), /tmp/site (where the third carry call installs vLLM) on PYTHONPATH, and $OUT.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$PWD/device-out}"; mkdir -p "$OUT"
