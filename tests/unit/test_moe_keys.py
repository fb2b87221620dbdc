"""A key reorders each mixture-of-experts layer's experts by that layer's own permutation, so the key space the pages
count in bits (n_layers x log2 E!, tests/unit/test_moe.py) is the one a key draws from; and it translates each
layer's router by that layer's own vector."""

from perm_core.engine import symmetries
from perm_core.engine.transforms import composed
from perm_core.models.random_models import build_random_model
from perm_core.verify.subject import Subject


def test_each_layer_reorders_its_experts_by_its_own_permutation():
    geometry = Subject(build_random_model("mixtral")[0]).geometry
    assert geometry.n_layers >= 2 and geometry.n_experts >= 4
    differing = 0
    for key in range(20):
        element = symmetries.build("experts", key, geometry, None)
        orders = [composed(element.spaces[("experts", layer)])[0].index for layer in range(geometry.n_layers)]
        assert all(sorted(order.tolist()) == list(range(geometry.n_experts)) for order in orders)
        differing += any(not order.equal(orders[0]) for order in orders[1:])
    # independent draws of 4! orders agree in every layer for about 1 key in 24; one shared order, for all 20
    assert differing >= 15


def test_each_layer_translates_its_router_by_its_own_vector():
    """router_shift: one (v, c) per MoE layer, drawn from the key for that layer: a shared draw gives every layer the
    same translation, which checks pass just as well."""
    geometry = Subject(build_random_model("mixtral")[0]).geometry
    for key in range(5):
        element = symmetries.build("router_shift", key, geometry, None)
        (first,), *others = [element.spaces[("router_shift", layer)] for layer in geometry.moe_layers]
        assert others and all(not other.vector.equal(first.vector) and other.offset != first.offset
                              for (other,) in others)
        assert first.rows.tolist() == [1.0] * geometry.n_experts  # every expert's row: the routing is unchanged
