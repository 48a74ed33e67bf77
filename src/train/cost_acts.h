// cost_acts.h — the cost model's activation bytes (cost_acts.c), for cost.c only: each function's comment
// there says what it counts. Sizes in bytes (float32 unless a hidden format is named), per rank of a mesh ms
// (NULL: one process) running B sequences of T tokens.
#pragma once
#include <stddef.h>
#include "core/config.h"
#include "parallel/mesh.h"
#include "train/options.h"

size_t att_hd(const ModelConfig *c);
size_t att_qd(const ModelConfig *c, int tp);
size_t att_kvd(const ModelConfig *c, int tp);
size_t mla_kept(const ModelConfig *c, int tp, int hid);
size_t mla_scratch(const ModelConfig *c, int tp);
int local_exchange(const MeshShape *ms);
double acts_layer(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int dense);
double acts_hid_rows(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int rc);
double acts_hidden(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int shared);
double acts_dropped(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int rc);
double acts_routed(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int inst, int kept,
                   double hb);
double acts_fp8_saved(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T);
int fp8_save_bit(const TrainOptions *o);
int routed_layers(const ModelConfig *c, int l0, int l1);
double acts_fp8_change(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int n);
int rc_of(const TrainOptions *o, int l);
int rc_count(const TrainOptions *o, int l0, int l1);
double acts_layers(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int l0, int l1,
                   const TrainOptions *o);
double acts_scratch(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, double hb);
double acts_lean(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int fp8, int rows);
double acts_head(const ModelConfig *c, const MeshShape *ms, size_t N, int lc);
double acts_vocab(const ModelConfig *c, const MeshShape *ms);
double acts_vocab_parts(const ModelConfig *c, const MeshShape *ms, size_t N);
double acts_mtp(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int lc);
double acts_hid_saved(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int rc);
double acts_lent(const ModelConfig *c, const MeshShape *ms, const TrainOptions *o, size_t B, size_t T,
                 int hid);
double acts_holes(const ModelConfig *c, const TrainOptions *o, size_t B, size_t T, int hid);
