"""An LLM-style server: a slow snapshot-able load, then a move to the GPU, then generate()."""

import time

import modal

image = (
    modal.Image.debian_slim(python_version="3.11")
    .pip_install("torch==2.4.0", "transformers")
    .env({"HF_HUB_ENABLE_HF_TRANSFER": "1"})
)
app = modal.App("llm-loader", image=image)

MODEL_NAME = "tiny-llm"

with image.imports():
    import json


@app.cls(gpu="A10G", scaledown_window=300, enable_memory_snapshot=True, timeout=600, min_containers=0)
class Model:
    @modal.enter(snap=True)
    def load_weights(self):
        time.sleep(0.3)  # the slow part a warm pool pays once
        self.steps = ["load"]

    @modal.enter()
    def to_gpu(self):
        self.steps.append("gpu")

    @modal.method()
    def generate(self, prompt: str, max_tokens: int = 4) -> str:
        words = prompt.split()
        return json.dumps({"model": MODEL_NAME, "steps": self.steps, "out": words[:max_tokens]})


@app.local_entrypoint()
def main():
    raise SystemExit("a local entrypoint must never run on a worker")
