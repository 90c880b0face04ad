"""The project's images, built locally (TEST AND DEV TOOLING, not shipped): buildah from the committed Dockerfiles
on a base made by mmdebstrap, stored per machine in ~/.cache/qwen-hicache/containers (see ``build``)."""
