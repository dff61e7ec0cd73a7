/*
 * safetensors.c — HF safetensors checkpoints: header validation, mmap of every shard, the
 * sharded index (model.safetensors.index.json), lookup by name, and the streaming writer.
 *
 * Owns: every check that makes a header trustworthy before a byte of tensor data is touched
 * (sane header length, valid JSON, known dtype, shape with <= 8 non-negative dims, offsets
 * inside the data area, size = product(shape) x dtype size in overflow-checked 64-bit math,
 * no two tensors overlapping, unique names across shards, index and shards agreeing).
 * Must not: interpret tensors (model/weights.c binds them) or copy tensor data.
 */
#include "model/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/fileio.h"
#include "model/json.h"

#define ST_MAX_HEADER (100u << 20) /* the reference reader's limit */
#define ST_MAX_INDEX (512u << 20)
#define INDEX_NAME "model.safetensors.index.json"

/* ---- dtypes ------------------------------------------------------------------------------- */

static const struct {
	const char *name;
	size_t size;
} dtypes[ST_DTYPE_COUNT] = {
	[ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_BF16] = {"BF16", 2}, [ST_F16] = {"F16", 2},
	[ST_F32] = {"F32", 4},         [ST_I32] = {"I32", 4},   [ST_I64] = {"I64", 8},
	[ST_U8] = {"U8", 1},
};

const char *st_dtype_name(enum st_dtype t)
{
	return (unsigned)t < ST_DTYPE_COUNT ? dtypes[t].name : "?";
}

size_t st_dtype_size(enum st_dtype t) { return (unsigned)t < ST_DTYPE_COUNT ? dtypes[t].size : 0; }

int st_dtype_parse(const char *s, size_t len)
{
	for (int i = 0; i < ST_DTYPE_COUNT; i++)
		if (strlen(dtypes[i].name) == len && !memcmp(dtypes[i].name, s, len))
			return i;
	return -1;
}

/* ---- header validation -------------------------------------------------------------------- */

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

/* Sort key for the overlap check: tensors by begin offset (data is still relative). */
static int cmp_begin(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)(*(const struct st_tensor *const *)a)->data;
	uintptr_t y = (uintptr_t)(*(const struct st_tensor *const *)b)->data;
	return x < y ? -1 : x > y;
}

/* Fills t from one header entry; data holds the relative begin offset. */
static int parse_entry(const struct json *v, struct st_tensor *t, uint64_t data_size,
		       const char *path, struct err *e)
{
	const char *n = t->name;
	if (v->type != JSON_OBJECT)
		return err_set(e, -EINVAL, "%s: tensor %s: header entry is %s, expected an object",
			       path, n, json_type_name(v->type));
	const struct json *dt = json_get(v, "dtype"), *sh = json_get(v, "shape"),
			  *off = json_get(v, "data_offsets");
	if (!dt || !sh || !off)
		return err_set(e, -EINVAL, "%s: tensor %s: header entry lacks \"%s\"", path, n,
			       !dt ? "dtype" : !sh ? "shape" : "data_offsets");
	if (dt->type != JSON_STRING)
		return err_set(e, -EINVAL, "%s: tensor %s: dtype is %s, expected a string", path, n,
			       json_type_name(dt->type));
	int d = st_dtype_parse(dt->str, dt->len);
	if (d < 0)
		return err_set(e, -EINVAL, "%s: tensor %s: unsupported dtype \"%.32s\"", path, n,
			       dt->str);
	t->dtype = (enum st_dtype)d;
	if (sh->type != JSON_ARRAY || sh->n > ST_MAX_DIMS)
		return err_set(e, -EINVAL, "%s: tensor %s: shape must be an array of at most %d dims",
			       path, n, ST_MAX_DIMS);
	t->ndim = (int)sh->n;
	uint64_t count = 1;
	int ovf = 0;
	for (int i = 0; i < t->ndim; i++) {
		int64_t x;
		if (json_int64(json_at(sh, (size_t)i), &x) || x < 0)
			return err_set(e, -EINVAL, "%s: tensor %s: shape[%d] is not a non-negative integer",
				       path, n, i);
		t->shape[i] = x;
		ovf |= __builtin_mul_overflow(count, (uint64_t)x, &count);
	}
	uint64_t nbytes;
	ovf |= __builtin_mul_overflow(count, (uint64_t)dtypes[d].size, &nbytes);
	if (ovf || nbytes > INT64_MAX || nbytes > SIZE_MAX)
		return err_set(e, -EOVERFLOW, "%s: tensor %s: shape overflows 64 bits", path, n);
	int64_t b, en;
	if (off->type != JSON_ARRAY || off->n != 2 || json_int64(json_at(off, 0), &b) ||
	    json_int64(json_at(off, 1), &en) || b < 0 || en < 0)
		return err_set(e, -EINVAL, "%s: tensor %s: data_offsets must be [begin, end] with "
			       "non-negative integers", path, n);
	if (b > en)
		return err_set(e, -EINVAL, "%s: tensor %s: data_offsets [%lld, %lld]: begin > end",
			       path, n, (long long)b, (long long)en);
	if ((uint64_t)(en - b) != nbytes)
		return err_set(e, -EINVAL, "%s: tensor %s: data_offsets [%lld, %lld] hold %lld bytes "
			       "but %s shape needs %llu", path, n, (long long)b, (long long)en,
			       (long long)(en - b), dtypes[d].name, (unsigned long long)nbytes);
	if ((uint64_t)en > data_size)
		return err_set(e, -EINVAL, "%s: tensor %s: data_offsets end %lld is beyond the data "
			       "area of %llu bytes (file truncated or offsets out of range)", path, n,
			       (long long)en, (unsigned long long)data_size);
	t->data = (const void *)(uintptr_t)b;
	t->nbytes = (size_t)nbytes;
	t->file = 0;
	return 0;
}

static int check_overlaps(struct st_tensor *t, size_t n, const char *path, struct err *e)
{
	if (n < 2)
		return 0;
	struct st_tensor **by = malloc(n * sizeof *by);
	if (!by)
		return err_set(e, -ENOMEM, "%s: out of memory", path);
	for (size_t i = 0; i < n; i++)
		by[i] = &t[i];
	qsort(by, n, sizeof *by, cmp_begin);
	int r = 0;
	const struct st_tensor *last = NULL; /* the non-empty tensor reaching furthest so far */
	uint64_t reach = 0;
	for (size_t i = 0; i < n && !r; i++) {
		uint64_t b = (uintptr_t)by[i]->data;
		if (!by[i]->nbytes)
			continue;
		if (last && b < reach)
			r = err_set(e, -EINVAL, "%s: tensors %s and %s overlap (bytes %llu..%llu and "
				    "%llu..%llu of the data area)", path, last->name, by[i]->name,
				    (unsigned long long)((uintptr_t)last->data),
				    (unsigned long long)reach, (unsigned long long)b,
				    (unsigned long long)(b + by[i]->nbytes));
		if (b + by[i]->nbytes > reach)
			reach = b + by[i]->nbytes, last = by[i];
	}
	free(by);
	return r;
}

static int is_metadata(const struct json *m)
{
	return m->key_len == 12 && !memcmp(m->key, "__metadata__", 12);
}

int st_parse_header(const uint8_t *file, size_t file_size, const char *path,
		    struct st_tensor **out, size_t *n_out, void **arena, struct err *e)
{
	*out = NULL;
	*n_out = 0;
	*arena = NULL;
	if (file_size < 8)
		return err_set(e, -EINVAL, "%s: %zu bytes is too short for a safetensors file", path,
			       file_size);
	uint64_t hl = le64(file);
	if (hl > ST_MAX_HEADER)
		return err_set(e, -EINVAL, "%s: header length %llu exceeds the limit of %u bytes",
			       path, (unsigned long long)hl, ST_MAX_HEADER);
	if (hl > file_size - 8)
		return err_set(e, -EINVAL, "%s: header length %llu exceeds the file's %zu bytes "
			       "(truncated?)", path, (unsigned long long)hl, file_size);
	uint64_t data_size = file_size - 8 - hl;
	struct json_doc doc;
	int r = json_parse(&doc, (const char *)file + 8, (size_t)hl);
	if (r)
		return err_set(e, r, "%s: header is not valid JSON: %s", path, doc.err);
	const struct json *root = doc.root;
	if (root->type != JSON_OBJECT) {
		enum json_type t = root->type;
		json_doc_free(&doc);
		return err_set(e, -EINVAL, "%s: header is %s, expected an object", path,
			       json_type_name(t));
	}
	size_t n = 0, names = 0;
	for (const struct json *m = root->child; m; m = m->next) {
		if (is_metadata(m))
			continue;
		n++;
		names += m->key_len + 1;
	}
	struct st_tensor *t = calloc(n ? n : 1, sizeof *t);
	char *nb = malloc(names ? names : 1);
	if (!t || !nb) {
		r = err_set(e, -ENOMEM, "%s: out of memory", path);
		goto err;
	}
	size_t i = 0;
	char *np = nb;
	for (const struct json *m = root->child; m && !r; m = m->next) {
		if (is_metadata(m)) {
			if (m->type != JSON_OBJECT)
				r = err_set(e, -EINVAL, "%s: __metadata__ is %s, expected an object",
					    path, json_type_name(m->type));
			continue;
		}
		if (!m->key_len || strlen(m->key) != m->key_len) {
			r = err_set(e, -EINVAL, "%s: a tensor name is empty or holds a NUL byte", path);
			break;
		}
		memcpy(np, m->key, m->key_len + 1);
		t[i].name = np;
		np += m->key_len + 1;
		r = parse_entry(m, &t[i], data_size, path, e);
		i++;
	}
	if (r)
		goto err;
	qsort(t, n, sizeof *t, cmp_name);
	for (i = 1; i < n; i++)
		if (!strcmp(t[i - 1].name, t[i].name)) {
			r = err_set(e, -EINVAL, "%s: tensor %s appears twice in the header", path,
				    t[i].name);
			goto err;
		}
	if ((r = check_overlaps(t, n, path, e)))
		goto err;
	json_doc_free(&doc);
	*out = t;
	*n_out = n;
	*arena = nb;
	return 0;
err:
	json_doc_free(&doc);
	free(t);
	free(nb);
	return r;
}

/* ---- checkpoints -------------------------------------------------------------------------- */

/* What ckpt->arena holds: every allocation made while opening. */
struct ck_arena {
	size_t n, cap;
	void **p;
};

static int keep(struct checkpoint *ck, void *p)
{
	struct ck_arena *a = ck->arena;
	if (a->n == a->cap) {
		size_t cap = a->cap ? 2 * a->cap : 16;
		void **q = realloc(a->p, cap * sizeof *q);
		if (!q)
			return -ENOMEM;
		a->p = q, a->cap = cap;
	}
	a->p[a->n++] = p;
	return 0;
}

void ckpt_close(struct checkpoint *ck)
{
	for (int i = 0; i < ck->n_files; i++) {
		struct st_file *f = &ck->files[i];
		if (f->map && f->map != MAP_FAILED)
			munmap(f->map, f->size);
		if (f->fd >= 0)
			close(f->fd);
		free(f->path);
	}
	free(ck->files);
	free(ck->tensors);
	free(ck->dir);
	struct ck_arena *a = ck->arena;
	if (a) {
		for (size_t i = 0; i < a->n; i++)
			free(a->p[i]);
		free(a->p);
		free(a);
	}
	memset(ck, 0, sizeof *ck);
}

static int add_file(struct checkpoint *ck, const char *path)
{
	struct st_file *f = realloc(ck->files, (size_t)(ck->n_files + 1) * sizeof *f);
	if (!f)
		return -ENOMEM;
	ck->files = f;
	f = &ck->files[ck->n_files];
	memset(f, 0, sizeof *f);
	f->fd = -1;
	if (!(f->path = strdup(path)))
		return -ENOMEM;
	ck->n_files++;
	return 0;
}

/* Opens, maps and validates file i, appending its tensors to *all. */
static int load_file(struct checkpoint *ck, int i, const char *why, struct st_tensor **all,
		     size_t *n_all, struct err *e)
{
	struct st_file *f = &ck->files[i];
	f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
	if (f->fd < 0)
		return err_set(e, -errno, "%s: cannot open%s: %s", f->path, why, strerror(errno));
	struct stat st;
	if (fstat(f->fd, &st) || !S_ISREG(st.st_mode))
		return err_set(e, -EINVAL, "%s: not a regular file%s", f->path, why);
	f->size = (size_t)st.st_size;
	if (f->size < 8)
		return err_set(e, -EINVAL, "%s: %zu bytes is too short for a safetensors file "
			       "(truncated?)", f->path, f->size);
	f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, f->fd, 0);
	if (f->map == MAP_FAILED) {
		f->map = NULL;
		return err_set(e, -errno, "%s: mmap failed: %s", f->path, strerror(errno));
	}
	struct st_tensor *t;
	size_t n;
	void *names;
	int r = st_parse_header(f->map, f->size, f->path, &t, &n, &names, e);
	if (r)
		return r;
	if (keep(ck, names)) {
		free(names);
		free(t);
		return err_set(e, -ENOMEM, "out of memory");
	}
	const uint8_t *data = (const uint8_t *)f->map + 8 + le64(f->map);
	struct st_tensor *grown = realloc(*all, (*n_all + n + 1) * sizeof *grown);
	if (!grown) {
		free(t);
		return err_set(e, -ENOMEM, "out of memory");
	}
	*all = grown;
	for (size_t k = 0; k < n; k++) {
		t[k].data = data + (uintptr_t)t[k].data;
		t[k].file = i;
		grown[*n_all + k] = t[k];
	}
	*n_all += n;
	free(t);
	return 0;
}

static int is_safetensors(const char *name)
{
	size_t n = strlen(name);
	return n > 12 && !strcmp(name + n - 12, ".safetensors");
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Lists DIR/ *.safetensors in name order. */
static int list_dir(struct checkpoint *ck, struct err *e)
{
	DIR *d = opendir(ck->dir);
	if (!d)
		return err_set(e, -errno, "%s: cannot open directory: %s", ck->dir, strerror(errno));
	char **names = NULL;
	size_t n = 0;
	int r = 0;
	for (struct dirent *de; (de = readdir(d)) && !r;) {
		if (!is_safetensors(de->d_name))
			continue;
		char **g = realloc(names, (n + 1) * sizeof *g);
		if (!g || !(g[n] = strdup(de->d_name))) {
			names = g ? g : names;
			r = err_set(e, -ENOMEM, "%s: out of memory", ck->dir);
			break;
		}
		names = g;
		n++;
	}
	closedir(d);
	if (!r && !n)
		r = err_set(e, -ENOENT, "%s: no %s and no *.safetensors file", ck->dir, INDEX_NAME);
	if (!r)
		qsort(names, n, sizeof *names, cmp_str);
	char buf[4096];
	for (size_t i = 0; i < n && !r; i++)
		if (add_file(ck, path_join(buf, sizeof buf, ck->dir, names[i])))
			r = err_set(e, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return r;
}

/* Reads the index: registers each shard it names once, in order of first mention. */
static int read_index(struct checkpoint *ck, const char *ipath, struct json_doc *doc,
		      struct err *e)
{
	size_t len;
	char *text = file_read(ipath, &len, ST_MAX_INDEX, e);
	if (!text)
		return -EINVAL;
	int r = json_parse(doc, text, len);
	free(text);
	if (r)
		return err_set(e, r, "%s: not valid JSON: %s", ipath, doc->err);
	const struct json *wm = json_get(doc->root, "weight_map");
	if (!wm || wm->type != JSON_OBJECT)
		return err_set(e, -EINVAL, "%s: missing object \"weight_map\"", ipath);
	char buf[4096];
	for (const struct json *m = wm->child; m; m = m->next) {
		if (m->type != JSON_STRING || !m->len || strlen(m->str) != m->len ||
		    strchr(m->str, '/') || !strcmp(m->str, ".") || !strcmp(m->str, ".."))
			return err_set(e, -EINVAL, "%s: weight_map[\"%s\"] is not a shard file name",
				       ipath, m->key);
		int known = 0; /* shards are usually named in runs: look at the last one first */
		for (int i = ck->n_files - 1; i >= 0 && !known; i--)
			known = !strcmp(strrchr(ck->files[i].path, '/') + 1, m->str);
		if (!known && add_file(ck, path_join(buf, sizeof buf, ck->dir, m->str)))
			return err_set(e, -ENOMEM, "out of memory");
	}
	if (!ck->n_files)
		return err_set(e, -EINVAL, "%s: weight_map is empty", ipath);
	return 0;
}

/* Every weight_map entry names a tensor that exists in exactly that shard, and the shards hold
 * no tensor the map does not name. */
static int check_index(const struct checkpoint *ck, const char *ipath, const struct json *wm,
		       struct err *e)
{
	uint8_t *seen = calloc(ck->n_tensors + 1, 1);
	if (!seen)
		return err_set(e, -ENOMEM, "out of memory");
	int r = 0;
	for (const struct json *m = wm->child; m && !r; m = m->next) {
		const struct st_tensor *t = ckpt_find(ck, m->key);
		if (!t) {
			r = err_set(e, -EINVAL, "%s: weight_map names tensor %s in %s, but that "
				    "shard has no such tensor", ipath, m->key, m->str);
			break;
		}
		const char *shard = strrchr(ck->files[t->file].path, '/') + 1;
		if (strcmp(shard, m->str))
			r = err_set(e, -EINVAL, "%s: weight_map puts tensor %s in %s, but it is in %s",
				    ipath, m->key, m->str, ck->files[t->file].path);
		else if (seen[t - ck->tensors]++)
			r = err_set(e, -EINVAL, "%s: weight_map names tensor %s twice", ipath, m->key);
	}
	for (size_t i = 0; i < ck->n_tensors && !r; i++)
		if (!seen[i])
			r = err_set(e, -EINVAL, "%s: tensor %s is not in %s's weight_map",
				    ck->files[ck->tensors[i].file].path, ck->tensors[i].name, ipath);
	free(seen);
	return r;
}

int ckpt_open(struct checkpoint *ck, const char *path, struct err *e)
{
	memset(ck, 0, sizeof *ck);
	struct json_doc idx = {0};
	struct st_tensor *all = NULL;
	size_t n_all = 0;
	char ipath[4096] = "";
	int r = 0;
	if (!(ck->arena = calloc(1, sizeof(struct ck_arena))))
		return err_set(e, -ENOMEM, "out of memory");
	struct stat st;
	if (stat(path, &st)) {
		r = err_set(e, -errno, "%s: %s", path, strerror(errno));
		goto err;
	}
	if (S_ISDIR(st.st_mode)) {
		if (!(ck->dir = strdup(path))) {
			r = err_set(e, -ENOMEM, "%s: out of memory", path);
			goto err;
		}
		path_join(ipath, sizeof ipath, path, INDEX_NAME);
		if (access(ipath, F_OK) == 0)
			r = read_index(ck, ipath, &idx, e);
		else
			ipath[0] = 0, r = list_dir(ck, e);
	} else {
		const char *slash = strrchr(path, '/');
		ck->dir = slash ? strndup(path, (size_t)(slash - path + (slash == path))) : strdup(".");
		if (!ck->dir || add_file(ck, path))
			r = err_set(e, -ENOMEM, "%s: out of memory", path);
	}
	if (r)
		goto err;
	for (int i = 0; i < ck->n_files && !r; i++)
		r = load_file(ck, i, ipath[0] ? " (a shard named in " INDEX_NAME ")" : "", &all,
			      &n_all, e);
	if (r)
		goto err;
	qsort(all, n_all, sizeof *all, cmp_name);
	for (size_t i = 1; i < n_all; i++)
		if (!strcmp(all[i - 1].name, all[i].name)) {
			r = err_set(e, -EINVAL, "tensor %s appears in both %s and %s", all[i].name,
				    ck->files[all[i - 1].file].path, ck->files[all[i].file].path);
			goto err;
		}
	ck->tensors = all;
	ck->n_tensors = n_all;
	all = NULL;
	if (ipath[0] && (r = check_index(ck, ipath, json_get(idx.root, "weight_map"), e)))
		goto err;
	json_doc_free(&idx);
	return 0;
err:
	free(all);
	json_doc_free(&idx);
	ckpt_close(ck);
	return r;
}

const struct st_tensor *ckpt_find(const struct checkpoint *ck, const char *name)
{
	size_t lo = 0, hi = ck->n_tensors;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(ck->tensors[mid].name, name);
		if (!c)
			return &ck->tensors[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* ---- writer ------------------------------------------------------------------------------- */

struct wtensor {
	char *name;
	enum st_dtype dtype;
	int ndim;
	int64_t shape[ST_MAX_DIMS];
	uint64_t begin, end;
};

struct st_writer {
	char *path;
	int fd;
	int err;        /* first failure (negative errno); later calls do nothing */
	char why[256];  /* what failed */
	struct wtensor *t;
	size_t n, cap;
	uint64_t data_size; /* sum of tensor sizes */
	uint64_t pos;       /* bytes of the data area written or skipped */
	int started;
};

static int wfail(struct st_writer *w, int code, const char *what)
{
	if (!w->err) {
		w->err = code;
		snprintf(w->why, sizeof w->why, "%s%s%s", what, code == -EINVAL ? "" : ": ",
			 code == -EINVAL ? "" : strerror(-code));
	}
	return w->err;
}

struct st_writer *st_writer_open(const char *path, struct err *e)
{
	struct st_writer *w = calloc(1, sizeof *w);
	if (!w || !(w->path = strdup(path))) {
		free(w);
		err_set(e, -ENOMEM, "%s: out of memory", path);
		return NULL;
	}
	w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (w->fd < 0) {
		err_set(e, -errno, "%s: cannot create: %s", path, strerror(errno));
		free(w->path);
		free(w);
		return NULL;
	}
	return w;
}

int st_writer_add(struct st_writer *w, const char *name, enum st_dtype dtype, int ndim,
		  const int64_t *shape)
{
	if (w->err)
		return w->err;
	if (w->started || (unsigned)dtype >= ST_DTYPE_COUNT || ndim < 0 || ndim > ST_MAX_DIMS ||
	    !*name)
		return wfail(w, -EINVAL, "st_writer_add: bad arguments");
	if (w->n == w->cap) {
		size_t cap = w->cap ? 2 * w->cap : 64;
		struct wtensor *t = realloc(w->t, cap * sizeof *t);
		if (!t)
			return wfail(w, -ENOMEM, "out of memory");
		w->t = t, w->cap = cap;
	}
	struct wtensor *t = &w->t[w->n];
	memset(t, 0, sizeof *t);
	uint64_t bytes = st_dtype_size(dtype);
	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0 || __builtin_mul_overflow(bytes, (uint64_t)shape[i], &bytes))
			return wfail(w, -EINVAL, "st_writer_add: bad shape");
		t->shape[i] = shape[i];
	}
	if (!(t->name = strdup(name)))
		return wfail(w, -ENOMEM, "out of memory");
	t->dtype = dtype;
	t->ndim = ndim;
	t->begin = w->data_size;
	t->end = w->data_size + bytes;
	w->data_size = t->end;
	w->n++;
	return 0;
}

static int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t r = write(fd, c, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		c += r, n -= (size_t)r;
	}
	return 0;
}

int st_writer_begin_data(struct st_writer *w)
{
	if (w->err)
		return w->err;
	if (w->started)
		return wfail(w, -EINVAL, "st_writer_begin_data called twice");
	w->started = 1;
	struct sbuf b = {0};
	sbuf_puts(&b, "{\"__metadata__\":{\"format\":\"pt\"}");
	for (size_t i = 0; i < w->n; i++) {
		const struct wtensor *t = &w->t[i];
		sbuf_putc(&b, ',');
		json_write_str(&b, t->name, strlen(t->name), 0);
		sbuf_printf(&b, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(t->dtype));
		for (int k = 0; k < t->ndim; k++)
			sbuf_printf(&b, "%s%lld", k ? "," : "", (long long)t->shape[k]);
		sbuf_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->begin,
			    (unsigned long long)t->end);
	}
	sbuf_putc(&b, '}');
	while (b.len % 8) /* the data area starts 8-byte aligned, as the reference writer does */
		sbuf_putc(&b, ' ');
	if (b.oom) {
		sbuf_free(&b);
		return wfail(w, -ENOMEM, "out of memory");
	}
	uint8_t len[8];
	for (int i = 0; i < 8; i++)
		len[i] = (uint8_t)((uint64_t)b.len >> (8 * i));
	int r = write_all(w->fd, len, 8);
	if (!r)
		r = write_all(w->fd, b.p, b.len);
	sbuf_free(&b);
	return r ? wfail(w, r, "write failed") : 0;
}

int st_writer_data(struct st_writer *w, const void *p, size_t n)
{
	if (w->err)
		return w->err;
	if (!w->started || n > w->data_size - w->pos)
		return wfail(w, -EINVAL, "st_writer_data: more data than the tensors added");
	int r = write_all(w->fd, p, n);
	if (r)
		return wfail(w, r, "write failed");
	w->pos += n;
	return 0;
}

int st_writer_skip(struct st_writer *w, size_t n)
{
	if (w->err)
		return w->err;
	if (!w->started || n > w->data_size - w->pos)
		return wfail(w, -EINVAL, "st_writer_skip: beyond the data area");
	if (lseek(w->fd, (off_t)n, SEEK_CUR) < 0)
		return wfail(w, -errno, "lseek failed");
	w->pos += n;
	return 0;
}

int st_writer_close(struct st_writer *w, struct err *e)
{
	if (!w)
		return err_set(e, -EINVAL, "st_writer_close: no writer");
	int r = w->err;
	if (!r && !w->started)
		r = wfail(w, -EINVAL, "no data written (st_writer_begin_data never called)");
	if (!r && w->pos != w->data_size) {
		char msg[96];
		snprintf(msg, sizeof msg, "%llu of %llu data bytes written",
			 (unsigned long long)w->pos, (unsigned long long)w->data_size);
		r = wfail(w, -EINVAL, msg);
	}
	/* A skip at the end leaves the file short: extend it so the holes are part of the file. */
	off_t end = lseek(w->fd, 0, SEEK_CUR);
	if (!r && (end < 0 || ftruncate(w->fd, end)))
		r = wfail(w, -errno, "ftruncate failed");
	if (close(w->fd) && !r)
		r = wfail(w, -errno, "close failed");
	if (r)
		err_set(e, r, "%s: %s", w->path, w->why);
	for (size_t i = 0; i < w->n; i++)
		free(w->t[i].name);
	free(w->t);
	free(w->path);
	free(w);
	return r;
}
