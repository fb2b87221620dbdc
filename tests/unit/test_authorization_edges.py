"""Model authorization at the edge of its key range: 0 is a key like any other (a permutation, not "no key")."""

import pytest
import torch

from perm_core.applications.authorization import Lock, digits_accuracy
from perm_core.models.registry import load_model

pytestmark = pytest.mark.usefixtures("one_thread")
CLS = "vit.embeddings.cls_token"


def test_key_zero_unlocks_and_no_key_does_not():
    lock = Lock(load_model("digits-vit").model, 0)
    permutation = lock.key_permutation()
    assert not torch.equal(permutation, torch.arange(len(permutation)))  # key 0 draws a real permutation
    keyed, plain = lock.params_for(0), lock.subject.params
    assert torch.equal(keyed[CLS], plain[CLS][..., permutation])  # the key holder's client gathers by it
    assert not torch.equal(keyed[CLS], lock.params_for(None)[CLS])
    original = digits_accuracy(lock, plain)
    assert original > 0.95 and digits_accuracy(lock, keyed) == original
    assert digits_accuracy(lock, lock.params_for(None)) < 0.3
