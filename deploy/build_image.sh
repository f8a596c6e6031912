#!/usr/bin/env bash
# Build the grading image deploy/k8s/grade-job.yaml runs, from the repository root, with podman or docker.
#
#   bash deploy/build_image.sh                                  # efficient-ai-labs:latest, CUDA torch from PyPI
#   bash deploy/build_image.sh --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu   # CPU-only
#   IMAGE=registry.example.edu/course/efficient-ai-labs:2025 bash deploy/build_image.sh
#
# Extra arguments go to `podman build` / `docker build` (build arguments: see deploy/Containerfile). Where no
# public registry can be reached, make a Debian base image first (deploy/debian_base_image.sh) and pass
# --build-arg BASE_IMAGE=localhost/debian-bookworm:local. The image holds solutions: push it to a private registry.
# On a host with hybrid cgroups (v1 and v2), podman's default runtime crun stops at "cgroups in hybrid mode not
# supported": add --runtime runc (apt-get install runc); where the host caps open files or processes below podman's
# defaults ("setrlimit ... Operation not permitted"), add --ulimit nofile=1024:1024 --ulimit nproc=1024:1024.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE="${IMAGE:-efficient-ai-labs:latest}"
ENGINE="${ENGINE:-$(command -v podman || command -v docker || true)}"
[ -n "$ENGINE" ] || { echo "build_image.sh: needs podman or docker (Debian: apt-get install podman)" >&2; exit 2; }
"$ENGINE" build -f deploy/Containerfile -t "$IMAGE" "$@" .
echo "built $IMAGE"
