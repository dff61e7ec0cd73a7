/* test_safetensors.c — sha256 vectors, the safetensors writer/reader round trip, every header
 * check (each corruption gives a message naming the file and the tensor), shards and index. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/fileio.h"
#include "model/safetensors.h"
#include "model/sha256.h"
#include "tests/ckpt_helpers.h"
#include "tests/test.h"

TEST(sha256, known_vectors)
{
	char hex[65];
	sha256_hex("", 0, hex);
	CHECK_EQ_STR(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	sha256_hex("abc", 3, hex);
	CHECK_EQ_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	sha256_hex(m, strlen(m), hex);
	CHECK_EQ_STR(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	/* one million 'a', fed in uneven pieces through the streaming interface */
	char a[1000];
	memset(a, 'a', sizeof a);
	struct sha256 s;
	sha256_init(&s);
	size_t left = 1000000, k = 1;
	while (left) {
		size_t n = k % 997 + 1 < left ? k % 997 + 1 : left;
		sha256_update(&s, a, n);
		left -= n;
		k = k * 31 + 7;
	}
	uint8_t d[32];
	sha256_final(&s, d);
	for (int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", d[i]);
	CHECK_EQ_STR(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(safetensors, dtypes)
{
	const char *names[] = {"F8_E4M3", "BF16", "F16", "F32", "I32", "I64", "U8"};
	const size_t sizes[] = {1, 2, 2, 4, 4, 8, 1};
	for (int i = 0; i < ST_DTYPE_COUNT; i++) {
		CHECK_EQ_INT(st_dtype_parse(names[i], strlen(names[i])), i);
		CHECK_EQ_STR(st_dtype_name((enum st_dtype)i), names[i]);
		CHECK_EQ_INT(st_dtype_size((enum st_dtype)i), sizes[i]);
	}
	CHECK_EQ_INT(st_dtype_parse("F64", 3), -1);
	CHECK_EQ_INT(st_dtype_parse("BF1", 3), -1);
}

/* Writes three tensors of different dtypes; data bytes are i*7+name-length. */
static void write_sample(const char *path)
{
	struct err e;
	struct st_writer *w = st_writer_open(path, &e);
	REQUIRE(w);
	int64_t s1[2] = {3, 5}, s2[1] = {4}, s3[3] = {2, 1, 3};
	REQUIRE(st_writer_add(w, "b.weight", ST_BF16, 2, s1) == 0);
	REQUIRE(st_writer_add(w, "a.scale", ST_F32, 1, s2) == 0);
	REQUIRE(st_writer_add(w, "c.codes", ST_F8_E4M3, 3, s3) == 0);
	REQUIRE(st_writer_add(w, "d.empty", ST_I64, 0, NULL) == 0); /* a scalar: 8 bytes */
	REQUIRE(st_writer_begin_data(w) == 0);
	uint8_t buf[64];
	size_t sizes[4] = {30, 16, 6, 8};
	for (int t = 0; t < 4; t++) {
		for (size_t i = 0; i < sizes[t]; i++)
			buf[i] = (uint8_t)(i * 7 + (size_t)t);
		REQUIRE(st_writer_data(w, buf, sizes[t]) == 0);
	}
	REQUIRE(st_writer_close(w, &e) == 0);
}

TEST(safetensors, write_read_round_trip)
{
	char path[512];
	snprintf(path, sizeof path, "%s/one.safetensors", test_tmpdir());
	write_sample(path);
	struct checkpoint ck;
	struct err e;
	REQUIRE(ckpt_open(&ck, path, &e) == 0);
	REQUIRE(ck.n_tensors == 4);
	CHECK_EQ_STR(ck.tensors[0].name, "a.scale"); /* sorted by name */
	CHECK_EQ_STR(ck.tensors[3].name, "d.empty");
	const struct st_tensor *t = ckpt_find(&ck, "b.weight");
	REQUIRE(t);
	CHECK(t->dtype == ST_BF16 && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 5);
	CHECK_EQ_INT(t->nbytes, 30);
	CHECK(((const uint8_t *)t->data)[29] == (uint8_t)(29 * 7));
	t = ckpt_find(&ck, "c.codes");
	REQUIRE(t && t->ndim == 3 && t->nbytes == 6);
	CHECK(((const uint8_t *)t->data)[5] == 5 * 7 + 2);
	t = ckpt_find(&ck, "d.empty");
	REQUIRE(t && t->ndim == 0 && t->nbytes == 8);
	CHECK(((uintptr_t)ckpt_find(&ck, "b.weight")->data & 7) == 0); /* 8-aligned data area */
	CHECK(ckpt_find(&ck, "nope") == NULL);
	ckpt_close(&ck);
	/* a directory holding only model.safetensors-like files opens too */
	REQUIRE(ckpt_open(&ck, test_tmpdir(), &e) == 0);
	CHECK_EQ_INT(ck.n_tensors, 4);
	ckpt_close(&ck);
}

TEST(safetensors, writer_misuse)
{
	char path[512];
	struct err e;
	snprintf(path, sizeof path, "%s/x.safetensors", test_tmpdir());
	struct st_writer *w = st_writer_open(path, &e);
	REQUIRE(w);
	int64_t s[1] = {4};
	REQUIRE(st_writer_add(w, "t", ST_F32, 1, s) == 0);
	REQUIRE(st_writer_begin_data(w) == 0);
	uint8_t b[32] = {0};
	CHECK(st_writer_data(w, b, 8) == 0);
	CHECK(st_writer_data(w, b, 16) == -EINVAL); /* more than the tensors hold */
	CHECK(st_writer_close(w, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, path);
	w = st_writer_open(path, &e);
	REQUIRE(w);
	REQUIRE(st_writer_add(w, "t", ST_F32, 1, s) == 0);
	REQUIRE(st_writer_begin_data(w) == 0);
	CHECK(st_writer_data(w, b, 8) == 0);
	CHECK(st_writer_close(w, &e) == -EINVAL); /* short */
	CHECK_CONTAINS(e.msg, "8 of 16 data bytes");
	snprintf(path, sizeof path, "%s/no/such/dir/x.safetensors", test_tmpdir());
	CHECK(st_writer_open(path, &e) == NULL);
	CHECK_CONTAINS(e.msg, "cannot create");
}

TEST(safetensors, skip_leaves_holes)
{
	char path[512];
	struct err e;
	snprintf(path, sizeof path, "%s/holes.safetensors", test_tmpdir());
	struct st_writer *w = st_writer_open(path, &e);
	REQUIRE(w);
	int64_t big[2] = {16384, 16384}, small[1] = {16};
	REQUIRE(st_writer_add(w, "big", ST_BF16, 2, big) == 0);     /* 512 MiB */
	REQUIRE(st_writer_add(w, "small", ST_F32, 1, small) == 0);
	REQUIRE(st_writer_add(w, "tail", ST_F8_E4M3, 2, big) == 0); /* 256 MiB, a trailing hole */
	REQUIRE(st_writer_begin_data(w) == 0);
	float v[16];
	for (int i = 0; i < 16; i++)
		v[i] = (float)i;
	REQUIRE(st_writer_skip(w, (size_t)16384 * 16384 * 2) == 0);
	REQUIRE(st_writer_data(w, v, sizeof v) == 0);
	REQUIRE(st_writer_skip(w, (size_t)16384 * 16384) == 0);
	REQUIRE(st_writer_close(w, &e) == 0);
	struct stat st;
	REQUIRE(stat(path, &st) == 0);
	CHECK(st.st_size > (off_t)768 << 20);
	CHECK((int64_t)st.st_blocks * 512 < (int64_t)1 << 20); /* sparse: under 1 MiB on disk */
	struct checkpoint ck;
	REQUIRE(ckpt_open(&ck, path, &e) == 0);
	const struct st_tensor *t = ckpt_find(&ck, "small");
	REQUIRE(t);
	CHECK(((const float *)t->data)[15] == 15.0f);
	CHECK(((const uint16_t *)ckpt_find(&ck, "big")->data)[12345] == 0); /* holes read as 0 */
	ckpt_close(&ck);
}

/* A file with the given header text and `data` bytes of zeros after it. */
static const char *raw_file(const char *name, const char *header, size_t data)
{
	static char path[512];
	snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
	size_t hl = strlen(header);
	size_t n = 8 + hl + data;
	uint8_t *b = calloc(1, n);
	REQUIRE(b);
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
	memcpy(b + 8, header, hl);
	REQUIRE(file_write(path, b, n, NULL) == 0);
	free(b);
	return path;
}

/* Opens a file that must fail; checks the message names the file and each needle. */
static void expect_bad(const char *header, size_t data, const char *needle, const char *needle2)
{
	const char *path = raw_file("bad.safetensors", header, data);
	struct checkpoint ck;
	struct err e = {{0}};
	int r = ckpt_open(&ck, path, &e);
	CHECK(r < 0);
	if (r >= 0) {
		fprintf(stderr, "    header accepted: %s\n", header);
		ckpt_close(&ck);
		return;
	}
	CHECK_CONTAINS(e.msg, path);
	CHECK_CONTAINS(e.msg, needle);
	if (needle2)
		CHECK_CONTAINS(e.msg, needle2);
}

TEST(safetensors, header_checks)
{
	/* sanity: the good form opens */
	const char *ok = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
	struct checkpoint ck;
	struct err e;
	REQUIRE(ckpt_open(&ck, raw_file("ok.safetensors", ok, 16), &e) == 0);
	ckpt_close(&ck);

	/* out-of-range offsets */
	expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,32]}}", 16, "tensor w",
		   "beyond the data area");
	/* size != product(shape) x dtype size */
	expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,8]}}", 16, "tensor w",
		   "F32 shape needs 16");
	/* overlap */
	expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]},"
		   "\"b\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[8,24]}}", 24, "a and b",
		   "overlap");
	/* begin > end */
	expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,0]}}", 16, "tensor w",
		   "begin > end");
	/* missing fields, wrong types */
	expect_bad("{\"w\":{\"shape\":[4],\"data_offsets\":[0,4]}}", 4, "tensor w", "dtype");
	expect_bad("{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,4]}}", 4, "tensor w", "shape");
	expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4]}}", 4, "tensor w", "data_offsets");
	expect_bad("{\"w\":{\"dtype\":\"F64\",\"shape\":[4],\"data_offsets\":[0,32]}}", 32, "tensor w",
		   "unsupported dtype");
	expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[-4],\"data_offsets\":[0,4]}}", 4, "tensor w",
		   "shape[0]");
	expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
		   "tensor w", "at most 8");
	expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4.5],\"data_offsets\":[0,4]}}", 4, "tensor w",
		   "shape[0]");
	expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0]}}", 4, "tensor w",
		   "data_offsets");
	expect_bad("{\"w\":[1,2]}", 0, "tensor w", "expected an object");
	/* 64-bit overflow of the size */
	expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}",
		   0, "tensor w", "overflows");
	expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2305843009213693952],\"data_offsets\":[0,0]}}",
		   0, "tensor w", "overflows");
	/* duplicates, bad JSON, bad metadata, non-object header */
	expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
		   "\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8, "tensor w", "twice");
	expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]", 4, "not valid JSON",
		   "line 1");
	expect_bad("{\"__metadata__\":3}", 0, "__metadata__", NULL);
	expect_bad("[]", 0, "header is array", NULL);
	expect_bad("{\"\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, "name is empty",
		   NULL);
}

TEST(safetensors, header_length_checks)
{
	struct checkpoint ck;
	struct err e;
	char path[512];
	snprintf(path, sizeof path, "%s/h.safetensors", test_tmpdir());
	uint8_t b[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
	REQUIRE(file_write(path, b, 10, NULL) == 0);
	CHECK(ckpt_open(&ck, path, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "exceeds the limit");
	uint8_t c[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
	REQUIRE(file_write(path, c, 10, NULL) == 0);
	CHECK(ckpt_open(&ck, path, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "exceeds the file");
	REQUIRE(file_write(path, c, 5, NULL) == 0);
	CHECK(ckpt_open(&ck, path, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "too short");
	CHECK_CONTAINS(e.msg, path);
	/* the parser itself, as the fuzz target calls it */
	struct st_tensor *t;
	size_t n;
	void *arena;
	uint8_t d[10] = {2, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
	REQUIRE(st_parse_header(d, 10, "mem", &t, &n, &arena, &e) == 0);
	CHECK_EQ_INT(n, 0);
	free(t);
	free(arena);
}

TEST(safetensors, truncated_shard)
{
	char path[512];
	snprintf(path, sizeof path, "%s/t.safetensors", test_tmpdir());
	write_sample(path);
	struct stat st;
	REQUIRE(stat(path, &st) == 0);
	REQUIRE(truncate(path, st.st_size - 3) == 0);
	struct checkpoint ck;
	struct err e;
	CHECK(ckpt_open(&ck, path, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, path);
	CHECK_CONTAINS(e.msg, "tensor d.empty");
	CHECK_CONTAINS(e.msg, "truncated");
}

/* Two shards and an index in TMP/sh. */
static const char *write_shards(const char *index)
{
	static char dir[512];
	char p[1024];
	snprintf(dir, sizeof dir, "%s/sh", test_tmpdir());
	mkdir(dir, 0755);
	struct err e;
	for (int s = 0; s < 2; s++) {
		snprintf(p, sizeof p, "%s/model-0000%d-of-00002.safetensors", dir, s + 1);
		struct st_writer *w = st_writer_open(p, &e);
		REQUIRE(w);
		int64_t shape[1] = {4};
		char name[32];
		for (int k = 0; k < 2; k++) {
			snprintf(name, sizeof name, "t%d%d", s, k);
			REQUIRE(st_writer_add(w, name, ST_F32, 1, shape) == 0);
		}
		REQUIRE(st_writer_begin_data(w) == 0);
		float v[8] = {(float)s, 1, 2, 3, 4, 5, 6, 7};
		REQUIRE(st_writer_data(w, v, sizeof v) == 0);
		REQUIRE(st_writer_close(w, &e) == 0);
	}
	snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
	REQUIRE(file_write(p, index, strlen(index), NULL) == 0);
	return dir;
}

#define SH1 "model-00001-of-00002.safetensors"
#define SH2 "model-00002-of-00002.safetensors"

static void expect_index_bad(const char *index, const char *n1, const char *n2)
{
	const char *dir = write_shards(index);
	struct checkpoint ck;
	struct err e;
	int r = ckpt_open(&ck, dir, &e);
	CHECK(r < 0);
	if (r >= 0) {
		ckpt_close(&ck);
		return;
	}
	CHECK_CONTAINS(e.msg, n1);
	if (n2)
		CHECK_CONTAINS(e.msg, n2);
}

TEST(safetensors, sharded_index)
{
	const char *good = "{\"metadata\": {\"total_size\": 64}, \"weight_map\": {\"t00\": \"" SH1
			   "\", \"t01\": \"" SH1 "\", \"t10\": \"" SH2 "\", \"t11\": \"" SH2 "\"}}";
	const char *dir = write_shards(good);
	struct checkpoint ck;
	struct err e;
	REQUIRE(ckpt_open(&ck, dir, &e) == 0);
	CHECK_EQ_INT(ck.n_files, 2);
	CHECK_EQ_INT(ck.n_tensors, 4);
	const struct st_tensor *t = ckpt_find(&ck, "t10");
	REQUIRE(t);
	CHECK(((const float *)t->data)[0] == 1.0f);
	CHECK_CONTAINS(ck.files[t->file].path, SH2);
	ckpt_close(&ck);

	/* a shard the index names is missing */
	expect_index_bad("{\"weight_map\": {\"t00\": \"" SH1 "\", \"t01\": \"" SH1 "\", \"t10\": "
			 "\"model-00003-of-00002.safetensors\"}}",
			 "model-00003-of-00002.safetensors", "No such file");
	/* the index puts a tensor in the wrong shard */
	expect_index_bad("{\"weight_map\": {\"t00\": \"" SH2 "\", \"t01\": \"" SH1 "\", \"t10\": \"" SH2
			 "\", \"t11\": \"" SH2 "\"}}", "tensor t00", SH1);
	/* a tensor the index does not name */
	expect_index_bad("{\"weight_map\": {\"t00\": \"" SH1 "\", \"t10\": \"" SH2 "\", \"t11\": \"" SH2
			 "\"}}", "tensor t01", "weight_map");
	/* the index names a tensor no shard has */
	expect_index_bad("{\"weight_map\": {\"t00\": \"" SH1 "\", \"t01\": \"" SH1 "\", \"t10\": \"" SH2
			 "\", \"t11\": \"" SH2 "\", \"t99\": \"" SH2 "\"}}", "tensor t99", SH2);
	/* a path instead of a file name */
	expect_index_bad("{\"weight_map\": {\"t00\": \"../x.safetensors\"}}", "t00",
			 "not a shard file name");
	expect_index_bad("{\"weight_map\": []}", "weight_map", NULL);
	expect_index_bad("{\"weight_map\": {}}", "empty", NULL);
}

TEST(safetensors, duplicate_across_shards)
{
	const char *dir = write_shards("{\"weight_map\": {\"t00\": \"" SH1 "\"}}");
	/* a third file holding t00 again; open the directory without the index */
	char p[1024];
	snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
	REQUIRE(unlink(p) == 0);
	snprintf(p, sizeof p, "%s/zz.safetensors", dir);
	struct err e;
	struct st_writer *w = st_writer_open(p, &e);
	REQUIRE(w);
	int64_t shape[1] = {1};
	REQUIRE(st_writer_add(w, "t00", ST_U8, 1, shape) == 0);
	REQUIRE(st_writer_begin_data(w) == 0);
	REQUIRE(st_writer_data(w, "x", 1) == 0);
	REQUIRE(st_writer_close(w, &e) == 0);
	struct checkpoint ck;
	CHECK(ckpt_open(&ck, dir, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "tensor t00 appears in both");
	CHECK_CONTAINS(e.msg, "zz.safetensors");
	/* an empty directory */
	snprintf(p, sizeof p, "%s/empty", test_tmpdir());
	mkdir(p, 0755);
	CHECK(ckpt_open(&ck, p, &e) == -ENOENT);
	CHECK_CONTAINS(e.msg, "no model.safetensors.index.json");
}
