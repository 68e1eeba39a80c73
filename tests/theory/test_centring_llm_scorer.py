"""The LLM scorer's entropies sit at the log-probs' positions, so exact REPO centring
(``centred_logprobs(logprobs, entropies)``) centres each token by its own state's entropy."""

from __future__ import annotations

import torch

from entrogym.algos.entropy import centred_logprobs
from entrogym.models import tiny_random_config
from entrogym.train.learner.logprobs import sequence_logprobs, sequence_logprobs_and_entropy


def test_entropies_align_with_logprobs_under_left_padding() -> None:
    from transformers import AutoModelForCausalLM

    config = tiny_random_config("llama", tie_word_embeddings=True, vocab_size=64)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    ids = torch.randint(3, 64, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding, as the trainer's batches have
    with torch.no_grad():
        lp, ent = sequence_logprobs_and_entropy(model, ids, mask, chunk_size=5)
        assert torch.equal(lp, sequence_logprobs(model, ids, mask, chunk_size=5))
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    logp_all = torch.log_softmax(logits.float(), -1)
    for b in range(2):
        for t in range(1, 9):
            if not (mask[b, t] and mask[b, t - 1]):
                assert lp[b, t] == 0 and ent[b, t] == 0
                continue
            dist = logp_all[b, t - 1]  # the distribution token t was drawn from
            h = -(dist.exp() * dist).sum()
            torch.testing.assert_close(ent[b, t], h, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(lp[b, t], dist[ids[b, t]], atol=1e-5, rtol=1e-5)
            # centred with that entropy, the log-prob has mean 0 under the state's policy
            centred_all = centred_logprobs(dist, h.expand_as(dist))
            assert abs(float((dist.exp() * centred_all).sum())) < 1e-5
    torch.testing.assert_close(centred_logprobs(lp, ent), lp + ent)
