"""A deployed app's class and function looked up by name, as Modal's guide calls another app.

Before: modal.Cls.from_name and modal.Function.from_name were absent under calque run. calque finds
the deployed pool by its calque:pool tag (calque pool list) and reads its spec from its group.
"""

import modal

app = modal.App("corpus-from-name")

Model = modal.Cls.from_name("parity/deployed", "Model")  # looked up at import, as Modal scripts do
square = modal.Function.from_name("parity/deployed-fn", "square")


@app.local_entrypoint()
def main():
    print("method", Model().double.remote(21))
    print("function", list(square.map([1, 2, 3])))
