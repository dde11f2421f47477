"""A Modal-shaped embedding service, the sandbox's demo workload (runs unchanged on a calque worker).

@enter stands in for a slow model load (1.5 s here, minutes for a real model): a calque worker pays
it once, so every later claim on that worker is a warm hit. The "embedding" is a deterministic hash
of the text, so the demo needs no GPU and no model download.
"""

import hashlib
import os
import time

import modal

app = modal.App("sandbox-embedder")
image = modal.Image.debian_slim().pip_install("sentence-transformers")


@app.cls(gpu="L4", image=image, scaledown_window=300)
class Embedder:
    dim: int = modal.parameter(default=8)

    @modal.enter()
    def load(self):
        time.sleep(float(os.environ.get("CALQUE_DEMO_ENTER_S", "1.5")))  # the "model load"
        self.model = f"demo-embedder-{self.dim}d"

    @modal.batched(max_batch_size=8, wait_ms=20)
    def embed(self, texts: list[str]) -> list[dict]:
        out = []
        for text in texts:
            digest = hashlib.sha256(text.encode()).digest()
            vector = [round(b / 255, 3) for b in digest[: self.dim]]
            out.append({"text": text, "model": self.model, "vector": vector})
        return out


@app.local_entrypoint()
def main(count: int = 6):
    # As on Modal: a batched method takes one input per call; .map streams results back in input order.
    texts = [f"sentence {i}" for i in range(count)]
    for text, row in zip(texts, Embedder().embed.map(texts)):
        print(f"{text!r} -> {row['vector'][:4]} ({row['model']})")
