/*
 * safetensors.h — reading (and writing) checkpoints in the HF safetensors format.
 *
 * A file is: u64-LE header length N, N bytes of JSON header {name: {dtype, shape,
 * data_offsets: [begin, end]}, "__metadata__": {...}}, then the raw little-endian data.
 * A checkpoint is one model.safetensors or shards listed by model.safetensors.index.json
 * ({"weight_map": {tensor: shard file}}).
 *
 * Owns: mmap of every shard, validation of each header before anything in it is trusted
 * (offsets inside the file, end - begin == product(shape) x dtype size, no overlaps, sane
 * lengths), lookup by name. Must not: interpret tensors (model/weights.c binds them).
 */
#ifndef DSV32_SAFETENSORS_H
#define DSV32_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "model/err.h"

enum st_dtype {
	ST_F8_E4M3,
	ST_BF16,
	ST_F16,
	ST_F32,
	ST_I32,
	ST_I64,
	ST_U8,
	ST_DTYPE_COUNT
};

#define ST_MAX_DIMS 8

struct st_tensor {
	const char *name;
	enum st_dtype dtype;
	int ndim;
	int64_t shape[ST_MAX_DIMS];
	const void *data; /* inside the shard's mapping */
	size_t nbytes;
	int file;         /* index into checkpoint.files */
};

struct st_file {
	char *path;
	int fd;
	void *map;
	size_t size;
};

struct checkpoint {
	char *dir;
	int n_files;
	struct st_file *files;
	size_t n_tensors;
	struct st_tensor *tensors; /* sorted by name */
	void *arena;               /* names and parsed headers */
};

const char *st_dtype_name(enum st_dtype t);
size_t st_dtype_size(enum st_dtype t);
/* "F8_E4M3" -> ST_F8_E4M3 etc.; -1 if unknown. */
int st_dtype_parse(const char *s, size_t len);

/* Opens DIR (model.safetensors.index.json if present, else every *.safetensors in DIR, or a
 * single .safetensors file path). Returns 0 or a negative errno with e naming the file and
 * what was wrong. */
int ckpt_open(struct checkpoint *ck, const char *path, struct err *e);
void ckpt_close(struct checkpoint *ck);
const struct st_tensor *ckpt_find(const struct checkpoint *ck, const char *name);

/* Validates one safetensors header held in memory (file_size = the whole file's size).
 * Used by ckpt_open and by the fuzz target. On success *out / *n_out hold the tensors (names
 * pointing into *arena, data pointers relative: (const void *)offset from the data start;
 * the caller frees both *out and *arena with free()). */
int st_parse_header(const uint8_t *file, size_t file_size, const char *path,
		    struct st_tensor **out, size_t *n_out, void **arena, struct err *e);

/* Writer: streams tensors into one shard file. Add every tensor's metadata first, then the
 * data in the same order. */
struct st_writer;
struct st_writer *st_writer_open(const char *path, struct err *e);
int st_writer_add(struct st_writer *w, const char *name, enum st_dtype dtype, int ndim,
		  const int64_t *shape);
/* Writes the header; after this, st_writer_data for each tensor in order. */
int st_writer_begin_data(struct st_writer *w);
int st_writer_data(struct st_writer *w, const void *p, size_t n);
/* Skips the next n bytes of the data area, leaving a hole (for header-only checkpoints). */
int st_writer_skip(struct st_writer *w, size_t n);
int st_writer_close(struct st_writer *w, struct err *e);

#endif
