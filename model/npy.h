/*
 * npy.h — NumPy .npy and .npz files: the exchange format of `dsv32 eval` dumps and of the
 * reference fixtures the tests compare against.
 *
 * Owns: .npy v1 headers (little-endian float32 / int32, C order), .npz archives (a zip of
 * stored, uncompressed "KEY.npy" entries with CRC-32), and readers for both (the reader also
 * accepts what numpy.savez writes: zip64 extras, data descriptors, npy v2/v3 headers).
 * Must not: compress, or hold more than the one array being written.
 */
#ifndef DSV32_NPY_H
#define DSV32_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "model/err.h"

enum npy_dtype { NPY_F32, NPY_I32 };

#define NPY_MAX_DIMS 8

struct npy_array {
	enum npy_dtype dtype;
	int ndim;
	int64_t shape[NPY_MAX_DIMS];
	void *data;     /* malloc'd, product(shape) elements of 4 bytes */
	size_t nbytes;
};

uint32_t npy_crc32(uint32_t crc, const void *p, size_t n);

/* Writes one array as PATH (.npy). 0 or -errno with e naming the path. */
int npy_write(const char *path, enum npy_dtype t, int ndim, const int64_t *shape,
	      const void *data, struct err *e);

struct npz_writer;
struct npz_writer *npz_open(const char *path, struct err *e);
/* Adds KEY.npy; keys are unique, [A-Za-z0-9_.-]. 0 or -errno (the archive stays valid up to the
 * previous entry only after npz_close). */
int npz_add(struct npz_writer *z, const char *key, enum npy_dtype t, int ndim,
	    const int64_t *shape, const void *data);
/* Writes the central directory and closes; frees z even on error. */
int npz_close(struct npz_writer *z, struct err *e);

/* Parses an in-memory .npy (copies the data). */
int npy_parse(const uint8_t *buf, size_t len, struct npy_array *a, struct err *e);
int npy_read(const char *path, struct npy_array *a, struct err *e);
/* Finds entry KEY(.npy) in an in-memory .npz and parses it; -ENOENT if absent. */
int npz_find(const uint8_t *z, size_t len, const char *key, struct npy_array *a, struct err *e);
/* Reads entry KEY(.npy) of an .npz file; -ENOENT if absent. */
int npz_read(const char *path, const char *key, struct npy_array *a, struct err *e);
void npy_free(struct npy_array *a);

#endif
