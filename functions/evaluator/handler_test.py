"""The digits evaluator function's contract: safetensors in, ``{"utility", "metrics"}`` out,
400 ``bad_weights`` with what was wrong for a body that is not a model it scores; and the cache
function's side of it (``cache_engine.evaluators.FunctionEvaluator``) against an answer that
breaks the contract. These run in the image build too, where there is no PyTorch: the models
are random weights of the demo's shapes (``tests/flstore/test_digits_evaluator.py`` compares
the forward passes with ``client.model``'s)."""

import http.server
import json
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save

from cache_engine.evaluators import EvaluatorUnavailable, FunctionEvaluator, layout_of

from .handler import SHAPES, handle


def make_model(seed, arch):
    """Random weights of the demo model ``arch``, as ``client.model.make_model`` gives them:
    uniform in +-1/sqrt(fan_in)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in SHAPES[arch].items():
        weight = SHAPES[arch][name.rsplit(".", 1)[0] + ".weight" if "." in name else "weight"]
        bound = 1 / np.sqrt(np.prod(weight[1:]))
        out[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    return out


def model_to_bytes(state):
    return save(state)


def _event(method, body=b""):
    return SimpleNamespace(body=body, headers={}, method=method, path="/")


@pytest.mark.parametrize("arch", ["cnn", "softmax"])
def test_a_model_of_the_demo_gets_its_accuracy_and_loss(arch):
    res = handle(_event("POST", model_to_bytes(make_model(0, arch))), None)
    assert res["statusCode"] == 200, res
    body = res["body"]
    assert body["utility"] == body["metrics"]["accuracy"] and 0 <= body["utility"] <= 1
    assert 350 < body["metrics"]["n"] < 370 and body["metrics"]["loss"] > 0  # 20% of each class


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"", "POST a model"),
        (b"not safetensors at all", "not safetensors"),
        (save({"weight": np.zeros((3, 3), np.float32)}), "do not fit"),
        (save({"weight": np.zeros((10, 64), np.float32)}), "missing: bias"),
        (
            save({"weight": np.zeros((10, 64), np.float32), "bias": np.zeros(9, np.float32)}),
            "bias (9,) (the model's is (10,))",
        ),
    ],
)
def test_a_body_that_is_not_a_model_it_scores_gets_400_saying_why(body, says):
    res = handle(_event("POST", body), None)
    assert res["statusCode"] == 400 and res["body"]["error"] == "bad_weights"
    assert says in res["body"]["detail"]


class _Answers(http.server.BaseHTTPRequestHandler):
    reply = b"{}"

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.reply)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    "reply",
    [
        b'{"metrics": {}}',
        b'{"utility": "high"}',
        b"[1]",
        b'{"utility": 1, "metrics": 3}',
        b'{"utility": NaN, "metrics": {}}',
    ],
)
def test_an_answer_outside_the_contract_is_an_error_naming_it(reply):
    _Answers.reply = reply
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        weights = model_to_bytes(make_model(0, "softmax"))
        ev = FunctionEvaluator(
            "bad", layout_of(weights), f"http://127.0.0.1:{server.server_port}", lambda: "t"
        )
        with pytest.raises(EvaluatorUnavailable, match='must answer {"utility"'):
            ev(np.zeros(650, np.float32))
        with pytest.raises(EvaluatorUnavailable, match="does not fit the job's tensors"):
            ev(np.zeros(7, np.float32))
    finally:
        server.shutdown()
        server.server_close()


def test_a_flat_vector_goes_out_as_the_jobs_tensors():
    weights = model_to_bytes(make_model(0, "cnn"))
    ev = FunctionEvaluator("f", layout_of(weights), "http://127.0.0.1:1", lambda: "t")
    from safetensors.numpy import load

    tensors = load(weights)
    flat = np.concatenate([tensors[k].ravel() for k in sorted(tensors)])
    back = load(ev.encode(flat))
    assert sorted(back) == sorted(tensors)
    for k in tensors:
        np.testing.assert_array_equal(back[k], tensors[k])
    assert json.loads(json.dumps(ev.layout)) is not None


@pytest.mark.parametrize("name", ["../system/functions", "Evaluator", "", "a/b"])
def test_an_evaluator_spec_names_a_function_nothing_else(name):
    from cache_engine.evaluators import build_evaluator

    weights = model_to_bytes(make_model(0, "softmax"))
    with pytest.raises(EvaluatorUnavailable, match="the function's name"):
        build_evaluator({"kind": "function", "function": name}, layout_of(weights))


def test_a_batch_of_models_in_one_request_gets_each_models_own_answer():
    models = [model_to_bytes(make_model(seed, "softmax")) for seed in range(3)]
    ev = FunctionEvaluator("f", layout_of(models[0]), "http://127.0.0.1:1", lambda: "t")
    from safetensors.numpy import load

    flats = []
    for m in models:
        t = load(m)
        flats.append(np.concatenate([t[k].ravel() for k in sorted(t)]))
    res = handle(_event("POST", ev.encode_batch(flats)), None)
    assert res["statusCode"] == 200, res
    singles = [handle(_event("POST", m), None)["body"] for m in models]
    assert res["body"]["utilities"] == [s["utility"] for s in singles]
    assert res["body"]["metrics"] == [s["metrics"] for s in singles]
    lying = save(
        {k: np.stack([load(m)[k] for m in models]) for k in sorted(load(models[0]))},
        metadata={"fedfaas.batch": "4"},
    )
    res = handle(_event("POST", lying), None)
    assert res["statusCode"] == 400 and "batch of 4" in res["body"]["detail"]


class _Handler(http.server.BaseHTTPRequestHandler):
    """The real handler behind HTTP, counting requests; ``batches=False`` plays an evaluator
    written before batches (it answers one model, and refuses a batch as a bad body)."""

    requests = 0
    batched = 0
    batches = True

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).requests += 1
        type(self).batched += b"fedfaas.batch" in body[:4096]
        if not self.batches and b"fedfaas.batch" in body[:4096]:
            res = {"statusCode": 400, "body": {"error": "bad_weights", "detail": "no"}}
        else:
            res = handle(_event("POST", body), None)
        self.send_response(res["statusCode"])
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(res["body"]).encode())

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("batches", [True, False])
def test_map_sends_batches_over_parallel_requests_or_one_model_each(batches):
    _Handler.requests, _Handler.batched, _Handler.batches = 0, 0, batches
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        weights = model_to_bytes(make_model(0, "softmax"))
        url = f"http://127.0.0.1:{server.server_port}"
        ev = FunctionEvaluator("f", layout_of(weights), url, lambda: "t", parallel=2, batch=8)
        rng = np.random.default_rng(0)
        models = [rng.normal(0, 0.1, 650).astype(np.float32) for _ in range(20)]
        got = ev.map(models)
        assert got == [ev(m) for m in models]
        if batches:  # 20 models of at most 8: 3 requests, then 20 single ones for the check
            assert _Handler.requests == 3 + 20 and ev.calls == 40
        else:  # refused (by one or both of the first two requests, sent at once): one model
            # per request from then on
            assert ev.batch == 1 and _Handler.requests - _Handler.batched == 20 + 20
    finally:
        server.shutdown()
        server.server_close()
