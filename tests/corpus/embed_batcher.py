"""An embedding batcher: @modal.batched receives lists and returns lists of the same length."""

import modal

app = modal.App("embedder")


@app.cls(gpu="L4", max_containers=4)
class Embedder:
    @modal.enter()
    def load(self):
        self.dim = 3

    @modal.batched(max_batch_size=4, wait_ms=200)
    def embed(self, texts: list[str]) -> list[dict]:
        return [{"len": len(t), "batch": len(texts), "dim": self.dim} for t in texts]
