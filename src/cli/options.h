// options.h (cli) — the `moe` option table's types and what the commands share of it: one table of
// options (option_table.c) serves flags (--d-model 128), JSON config files ({"d_model": 128}), --help,
// the run record and the option agreement of an MPI job; options.c parses and prints them.
// Must not hold: a command's own work (cmd_*.c), the run record (run_record.c).
#pragma once
#include <stddef.h>
#include <stdio.h>
#include "core/config.h"
#include "train/options.h"

enum {
    C_TRAIN = 1,
    C_SAMPLE = 2,
    C_EVAL = 4,
    C_INFO = 8,
    C_EXPORT = 16,
    C_TOKENIZE = 32,
    C_PREP = 64,
    C_PLAN = 128,
    C_TOKTRAIN = 256 // `moe tokenizer train`
};
typedef enum {
    O_INT,
    O_FLOAT,
    O_U64,
    O_STR,
    O_FLAG,
    O_DISPATCH,
    O_AUXFORM,
    O_SCHEDULE,
    O_AUTO_INT,
    O_HIER,
    O_EXPERTMODE,
    O_ALLINT,
    O_FAMILY,
    O_QKNORM,
    O_BALANCE,
    O_AUXSCOPE,
    O_RECOMPUTE,
    O_PRECISION,
    O_ROUNDING,
    O_GRADMEM,
    O_GPUCOMM,
    O_LAYERS, // a set of layers, "0,1,5" or "0-2,7" ("" or "none": no layer), as config.h's dense_layers bits
    O_PATHS // one or more paths: the words after the flag up to the next --option, kept '\n'-separated
} OptType;
typedef enum { W_MODEL, W_TRAIN, W_CLI } Where;

typedef struct {
    char preset[64], config[1024], ckpt[1024], prompt[4096], device[16];
    int tokens;
    char init_from[1024]; // train: a Hugging Face model directory to start from
    char dump[1024]; // eval: safetensors file for the first batch's numbers
    int dump_grads;
    int world; // moe info: the world size to lay the mesh out for
    int gpus, nodes_of, top; // moe plan: the GPUs, per node, the rows shown
    char gpu[1024], explain[512]; // moe plan: the profile (a built-in's name or a JSON file), one layout
    float imbalance, comm_exposed; // moe plan: the routing headroom factor, the exposed communication
    // moe plan: the mechanisms of a Megatron-Core run (--hide-a2a none|experts|1f1b, --a2a-links
    // flat|split|deepep, --combine f32|bf16, --grouped-rate profile|shape, --memory-model ours|megatron,
    // --hide-tp none|gemm, --hide-pp none|next, --hide-dp none|grads|grads+params) and
    // the inter-node link's rate (0: the profile's)
    char hide_a2a[16], a2a_links[16], combine[16], grouped_rate[16], memory_model[16];
    char hide_tp[16], hide_pp[16], hide_dp[16];
    float internode_gbps;
    int overlap_sms; // moe plan: the SMs an overlapped communication's kernels hold while they run
    int calibrate; // moe plan --calibrate: measure this machine, write a profile
    float temperature;
    int top_k, window, kv_cache; // sample
    float top_p;
    // tokenize: the tokenizer (directory or tokenizer.json), the input file; ids -> text, without the
    // special tokens, through the stream decoder; the post-processor's tokens (tokenize, prep)
    char tokenizer[1024], in[1024];
    int decode, skip_special, stream, add_special;
    // prep: the input files ('\n'-separated), the JSON lines' text field, the EOS token's text, one
    // document per line, the documents held out, the tokens per shard
    char inputs[16384], field[128], eos[256];
    int lines, val_docs, shard_tokens;
    int vocab; // tokenizer train: the vocabulary size
    char special[1024]; // tokenizer train: the special tokens, comma-separated
} CliOptions;

typedef struct {
    const char *name; // flag spelling without "--"; JSON key is the same with '_' for '-'
    OptType type;
    Where where;
    size_t off, size;
    int cmds;
    const char *help; // per command where the commands differ (a name may have one entry per command);
                      // --help appends "(default: X)" from the defaults unless the text says "default";
                      // "{presets}" in it is replaced by the preset table's names
} Opt;

// The table (option_table.c); its length is checked there against N_OPTS.
enum { N_OPTS = 180 };
extern const Opt opts[N_OPTS];

// The options whose values are words (and, for some, also a positive integer): each word's value
// (the enums are int-sized), and what --help shows.
typedef struct {
    OptType type;
    const char *usage;
    int int_ok;
    int n;
    const char *w[5];
    int v[5];
} WordSet;
const WordSet *word_set(OptType t); // NULL: not a word option

// Everything one command line sets: the model, the training options, the CLI's own, and which
// entries of opts were given (flag or config file).
typedef struct {
    ModelConfig model;
    TrainOptions train;
    CliOptions cli;
    int model_explicit;
    int set[N_OPTS];
} State;

const char *cmd_name(int cmd); // "train", "sample", ...
void *opt_ptr(State *s, const Opt *o); // where the option's value lives in s
int is_path_opt(const char *name); // names a file or directory
// The entry of name for cmd ('_' matches '-'); -2: the name exists but not for cmd; -1: no such option.
int find_opt(const char *name, int cmd);
int opt_set(const State *s, const char *name); // given, by any command's entry of that name
// --bf16-rounding and --bf16-grads given with a precision that has not bf16's storage: dies naming it (train,
// after --resume took the run's precision; info)
void opt_check_bf16_storage(const State *s);
// A value from the run record (who names it): as a flag's, except that an empty path there means none.
void set_recorded(State *s, int i, const char *val, const char *who);
// The option's value as text that a flag reads back exactly (the run record, --help's defaults, the
// override messages).
void opt_text(char *buf, size_t n, const Opt *o, const void *p);
// The option's value for messages (strings quoted, floats short).
void fmt_opt(char *buf, size_t n, const Opt *o, const void *p);
// The first model option given (flag or config file) whose value differs from c's, or -1; the names
// in allow are not compared but copied into c. a, b (64 bytes): the given and c's values.
int model_conflict(const State *s, ModelConfig *c, const char *const *allow, size_t n_allow, char *a,
                   char *b);

void state_defaults(State *s); // every option at its default: the tiny preset, train_options_default, ours
void usage(FILE *f, int cmd); // cmd 0: the list of commands; else cmd's options with their defaults
// argv (after the command word): --help prints usage and exits 0; --preset and --config apply first,
// then every flag in order; a bad one dies with a message naming it.
void parse(State *s, int cmd, int argc, char **argv);
