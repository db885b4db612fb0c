"""Every block of docs/guide/beyond-fit.md, run as written on ``photos-tfr`` (12 cats, 4 dogs), and
``readers.as_numpy``, the adapter its PyTorch and JAX loops go through.

PyTorch is not installed here (its wheel brings gigabytes of CUDA libraries): its block runs against ``FakeTorch``, a
few lines of numpy that check what the loop hands PyTorch. JAX's CPU wheel is in the test extra: its block runs
for real.
"""

from __future__ import annotations

import pathlib
import re
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
from helpers import convert_image_tree, make_tree
from tfshard import readers

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "guide" / "beyond-fit.md"


def blocks() -> dict[str, list[str]]:
    """``{section title: its python blocks}``, in page order."""
    found: dict[str, list[str]] = {}
    title = None
    for part in re.split(r"^(## .*)$", PAGE.read_text(), flags=re.M):
        if part.startswith("## "):
            title = part[3:].strip()
            continue
        if title is not None:
            found.setdefault(title, []).extend(re.findall(r"```python\n(.*?)```", part, flags=re.S))
    return {title: code for title, code in found.items() if code}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("beyond-fit")
    make_tree(str(root / "src" / "a"), classes=("cat",), per_class=12)
    make_tree(str(root / "src" / "a"), classes=("dog",), per_class=4, seed=100)
    convert_image_tree(root / "src" / "a", root / "photos-tfr")
    return root


def _run(code: str, name: str, namespace: dict | None = None) -> dict:
    namespace = dict(namespace or {})
    exec(compile(code, f"{PAGE.name}: {name}", "exec"), namespace)  # noqa: S102 (our own docs page)
    return namespace


def test_every_section_with_code_is_checked():
    assert {title: len(code) for title, code in blocks().items()} == {
        "Class weights from the manifest": 1, "A custom training loop": 1,
        "PyTorch and JAX: numpy batches with their length": 2}


def test_class_weights_for_model_fit(photos, monkeypatch):
    monkeypatch.chdir(photos)
    ns = _run(blocks()["Class weights from the manifest"][0], "class weights")
    assert ns["weights"] == {0: 16 / (2 * 12), 1: 16 / (2 * 4)}  # the mean weight of a record is 1
    assert len(ns["history"].history["loss"]) == 2 and np.isfinite(ns["history"].history["loss"]).all()


def test_the_custom_training_loop_under_a_strategy(photos, monkeypatch, strategies):
    """The page's ``MirroredStrategy()`` takes every logical CPU; in the suite it runs on the run's own 2-CPU strategy
    instead: a strategy on another device set, in a process whose other tests use ``strategies``, numbers its
    collectives alike, and its all-reduce met theirs (group of size 4 joining one of size 2)."""
    monkeypatch.chdir(photos)
    code, line = blocks()["A custom training loop"][0], "strategy = tf.distribute.MirroredStrategy()"
    assert line in code
    ns = _run(code.replace(line, "strategy = STRATEGY"), "custom loop", {"STRATEGY": strategies[2]})
    assert ns["steps"] == 2 and len(ns["losses"]) == 2 and np.isfinite(ns["losses"]).all()


class FakeTorch(types.ModuleType):
    """What the PyTorch block calls, in numpy, checking its inputs: a tensor is a numpy array; ``calls`` counts the
    optimizer's steps; a tensor is channels-first float32 images or int64 labels, or the test fails."""

    class Tensor(np.ndarray):
        def permute(self, *axes):
            return np.transpose(self, axes).view(FakeTorch.Tensor)

        def backward(self):
            pass

        def item(self):
            return float(self)

    def __init__(self):
        super().__init__("torch")
        self.steps = []
        fake = self

        class Linear:
            def __init__(self, inputs, outputs):
                self.w = np.zeros((inputs, outputs), np.float32)

            def __call__(self, x):
                assert x.shape[1] == self.w.shape[0], x.shape
                return (np.asarray(x) @ self.w).view(FakeTorch.Tensor)

        class Flatten:
            def __call__(self, x):
                assert x.ndim == 4 and x.shape[1] == 3 and x.dtype == np.float32, (x.shape, x.dtype)  # NCHW float32
                return np.asarray(x).reshape(len(x), -1).view(FakeTorch.Tensor)

        class Sequential:
            def __init__(self, *layers):
                self.layers = layers

            def __call__(self, x):
                for layer in self.layers:
                    x = layer(x)
                return x

            def parameters(self):
                return [layer.w for layer in self.layers if hasattr(layer, "w")]

        class SGD:
            def __init__(self, parameters, lr):
                self.parameters = list(parameters)

            def zero_grad(self):
                pass

            def step(self):
                fake.steps.append(1)

        def cross_entropy(logits, labels):
            assert labels.dtype == np.int64 and labels.shape == (len(logits),), (labels.dtype, labels.shape)
            shifted = logits - logits.max(1, keepdims=True)
            log_softmax = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
            return np.array(-log_softmax[np.arange(len(labels)), labels].mean()).view(FakeTorch.Tensor)

        self.from_numpy = lambda array: array.view(FakeTorch.Tensor)
        self.nn = types.SimpleNamespace(Sequential=Sequential, Flatten=Flatten, Linear=Linear,
                                        functional=types.SimpleNamespace(cross_entropy=cross_entropy))
        self.optim = types.SimpleNamespace(SGD=SGD)


def test_the_pytorch_loop_through_the_adapter(photos, monkeypatch, capsys):
    monkeypatch.chdir(photos)
    torch = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    ns = _run(blocks()["PyTorch and JAX: numpy batches with their length"][0], "pytorch")
    assert len(ns["batches"]) == 2 and len(torch.steps) == 4  # two epochs of two steps
    assert capsys.readouterr().out.splitlines()[-1].startswith("epoch 1: 2/2 steps, loss ")


def test_the_jax_loop_through_the_adapter(photos, monkeypatch):
    import jax

    monkeypatch.chdir(photos)
    ns = _run(blocks()["PyTorch and JAX: numpy batches with their length"][1], "jax")
    assert len(ns["batches"]) == 2 and np.isfinite(float(ns["loss"]))
    assert float(jax.numpy.abs(ns["params"]["w"]).sum()) > 0  # the step changed the weights


# ------------------------------------------------------------------------------------------------ readers.as_numpy


def test_as_numpy_is_a_new_pass_each_time_with_the_readers_length(photos):
    path = str(photos / "photos-tfr")
    ds = readers.images(path, batch_size=5, image_size=16, training=False, drop_remainder=False)
    batches = readers.as_numpy(ds)
    first, second = list(batches), list(batches)
    steps = readers.info(path).steps_per_epoch("train", 5, drop_remainder=False)
    assert len(batches) == len(first) == len(second) == 4 == steps
    expected = [(x.numpy(), y.numpy()) for x, y in ds]
    for got in (first, second):
        assert all(np.array_equal(a, b) and np.array_equal(c, d) for (a, c), (b, d) in zip(got, expected))
    assert isinstance(first[0][0], np.ndarray) and first[0][0].shape == (5, 16, 16, 3) and first[-1][0].shape[0] == 1
    assert "4 batches" in repr(batches)


def test_len_of_a_dataset_of_no_known_length_says_why(photos):
    repeated = readers.as_numpy(readers.images(str(photos / "photos-tfr"), batch_size=4, image_size=16, seed=0,
                                               repeat=True))
    with pytest.raises(TypeError, match=r"as_numpy: this dataset's length is .*; len\(\) needs a reader of one pass"):
        len(repeated)
    endless = readers.as_numpy(tf.data.Dataset.range(3).repeat())
    with pytest.raises(TypeError, match=r"as_numpy: this dataset's length is endless \(got cardinality -1\); len\(\)"):
        len(endless)
    unknown = readers.as_numpy(tf.data.Dataset.range(5).filter(lambda x: x > 2))
    with pytest.raises(TypeError, match=r"length is not known \(got cardinality -2\)"):
        len(unknown)
    assert [int(x) for x in unknown] == [3, 4]  # still iterable
    with pytest.raises(TypeError, match=r"as_numpy: takes a tf.data.Dataset, .*\(got list\); pass readers.images"):
        readers.as_numpy([1, 2])
