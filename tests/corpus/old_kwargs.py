"""Older-era keyword arguments, @modal.build, secrets and volumes that are only referenced."""

import modal

volume = modal.Volume.from_name("weights", create_if_missing=True)
app = modal.App(name="old-era", secrets=[modal.Secret.from_name("hf-token")])


@app.cls(
    gpu=modal.gpu.A100(count=1, size="40GB"),
    keep_warm=1,
    container_idle_timeout=300,
    allow_concurrent_inputs=2,
    concurrency_limit=5,
    volumes={"/weights": volume},
    secrets=[modal.Secret.from_dict({"K": "v"})],
)
class Legacy:
    @modal.build()
    def download(self):
        self.downloaded = True

    @modal.enter()
    def load(self):
        self.ready = self.downloaded
        volume.reload()

    @modal.method()
    def run(self, x: int) -> list:
        return [x, self.ready]
