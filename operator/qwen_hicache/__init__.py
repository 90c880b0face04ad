"""Kubernetes operator for SGLang HiCache serving of hybrid Qwen models."""
