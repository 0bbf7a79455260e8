"""Offline, CPU-only, quiet defaults for every test."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("LIT_ICLR_LINE_PROGRESS", "1")
