"""An import under image.imports() that the host lacks: must fail at load, naming the module."""

import modal

image = modal.Image.debian_slim().pip_install("calque_nonexistent_pkg")
app = modal.App("missing", image=image)

with image.imports():
    import calque_nonexistent_pkg


@app.cls()
class Broken:
    @modal.method()
    def go(self, x):
        return calque_nonexistent_pkg.go(x)
