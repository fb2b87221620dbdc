"""The adaptive inversion attacker undoes what it recovered exactly: on the digits every channel and every token
order comes back, so its reconstructions are the unprotected decoder's, score for score (a channel guess applied
the wrong way round, or tokens put back one position off, would leave them far apart)."""

import pytest

from perm_core.applications import inversion

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_adaptive_attacker_scores_exactly_what_the_unprotected_decoder_scores():
    result = inversion.run_attack(seed=0, key=2024, epochs=1, n_victims=10, n_show=0)
    rows = {(r.protection, r.attacker): r for r in result.rows}
    unprotected = rows[("none", "decoder")]
    for protection in ("tokens", "channels", "both"):
        adaptive = rows[(protection, "adaptive")]
        assert adaptive.channels_recovered == (None if protection == "tokens" else 64)
        assert adaptive.token_orders_recovered == (None if protection == "channels" else 1.0)
        assert (adaptive.ssim, adaptive.psnr) == (unprotected.ssim, unprotected.psnr), protection
    # the negative control: the plain decoder on permuted channels reconstructs nothing like the digits
    assert rows[("channels", "decoder")].ssim < unprotected.ssim - 0.3
