// dump.h — one validation batch's tensors (logits, losses, router logits, optionally every gradient) as a
// safetensors file, for comparing with another implementation (moe eval --dump).
// Must not hold: evaluation over the validation set (train/eval.h), checkpoints (io/).
#pragma once
#include "data/data.h"
#include "model/model.h"

// Writes a safetensors file (F32) describing the first validation batch (B sequences of ds->T), for
// comparing with another implementation (moe eval --dump): tokens and targets (B,T), logits (B,T,V),
// losses (B,T) per-token cross-entropy, router_logits.<layer> (B*T,E), and the scalars loss (mean
// cross-entropy), aux_loss (m->aux: the model's aux form), aux_loss_hf (HF's form: dump.c eval_aux_hf),
// z_loss. With grads: grad.<tensor name> of every parameter after one backward (no jitter) of
//   mean cross-entropy + aux_coef * aux_loss + z_coef * z_loss.
// The scalars are also in the header metadata at full precision ("%.17g"), with the keys of
// extra_meta (a JSON object of strings; may be NULL).
void eval_dump(Model *m, const Dataset *ds, int B, const char *path, int grads, float aux_coef, float z_coef,
               const char *extra_meta);
