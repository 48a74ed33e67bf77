// vocab.h — the vocabulary's two ends on a TP group: the token embedding and the LM head with its
// cross-entropy, whole on every TP rank or split by vocabulary rows (vocab-parallel, Megatron's: --vocab-
// parallel 1, params.h ParamSlicing.vocab; rank r of TP holds rows [V r / TP, V (r+1) / TP) of both tables
// and those columns of the logits). Split: the embedding's rows are each rank's own ids' (others zero),
// summed over TP (one rank's row and zeros: the same bits); its backward adds into the rank's own rows only;
// each row's loss combines the ranks' maxima and sums of exponentials (ops.h ce_part / ce_finish: one
// all-gather of 3 doubles a row); the head's input gradient is summed over TP. Both ways the rows of x and of
// the result are the same on every TP rank. Must not hold: the final norm, the MTP modules' shifts (model.c,
// mtp.c).
#pragma once
#include <stdint.h>
#include "model/model_types.h"

// Whether m splits the vocabulary over its TP group (mesh.sl.vocab with TP > 1).
int vocab_split(const Model *m);
// This rank's columns of the logits (V where whole) and the first's index in *v0 (NULL: not wanted).
int vocab_cols(const Model *m, int *v0);
// out (N,d) = the embedding rows of the host ids (checked in [0, V)); m->tokens keeps this rank's ids for
// vocab_embed_bwd.
void vocab_embed_fwd(Model *m, float *out, const int32_t *ids, int N);
// dtable += the rows of dout (N,d) at the ids of the last vocab_embed_fwd (this rank's rows).
void vocab_embed_bwd(Model *m, float *dtable, const float *dout, int N);
// logits (N, vocab_cols) = xn (N,d) x the head's rows; with host targets t (checked in [0, V)), losses (N)
// = the cross-entropy of each row (tdev: the device copy, this rank's ids) and, where dloss != 0, the logits
// overwritten with dlogits (ops.h cross_entropy_fwd_bwd: the hidden format).
void vocab_head_fwd(Model *m, float *logits, float *losses, int32_t *tdev, const float *xn, const int32_t *t,
                    int N, float dloss);
// The head's backward from dlogits: dxn (N,d) = dlogits x W (summed over TP where split), the head's
// gradient written or added (flags: model_dw_write's).
void vocab_head_bwd(Model *m, float *dxn, const float *dlogits, const float *xn, int N, int flags);
// The head over N rows in m->loss_chunks chunks (model_state.h model_set_loss_chunks): each chunk's logits in
// logits (its rows) and its losses, for the host targets t; where dx (training), each chunk's dlogits for
// dloss per row (none for the last k positions of each sequence of T: their rows zeroed) and its backward at
// once: the head's gradient written or added (model_dw_write), its input gradient into dx (N,d). With one
// chunk, vocab_head_fwd then vocab_head_bwd; the same bits per row in the losses and dx's rows.
void vocab_head_chunks(Model *m, float *logits, float *losses, int32_t *tdev, const float *xn,
                       const int32_t *t, int N, int T, int k, float dloss, float *dx);
// The V logits of row r of the last forward's logits (the rows the buffer holds: with --loss-chunks the last
// chunk's) on the host in out (gathered over TP where split).
void vocab_row_to_host(const Model *m, const float *logits, int N, int r, float *out);
