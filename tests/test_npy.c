/* test_npy.c — .npy/.npz writer and reader: round trips, header form, CRC-32, zip structure. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/fileio.h"
#include "model/npy.h"
#include "tests/test.h"

TEST(npy, crc32_check_value)
{
	CHECK(npy_crc32(0, "123456789", 9) == 0xcbf43926u);
	CHECK(npy_crc32(npy_crc32(0, "1234", 4), "56789", 5) == 0xcbf43926u);
	CHECK(npy_crc32(0, "", 0) == 0);
}

TEST(npy, npy_round_trip_and_header)
{
	char path[512];
	snprintf(path, sizeof path, "%s/a.npy", test_tmpdir());
	float d[6] = {1, -2, 3.5f, 0, 1e30f, -0.0f};
	int64_t shape[2] = {2, 3};
	struct err e;
	REQUIRE(npy_write(path, NPY_F32, 2, shape, d, &e) == 0);
	size_t len;
	char *raw = file_read(path, &len, 1 << 20, NULL);
	REQUIRE(raw);
	CHECK(!memcmp(raw, "\x93NUMPY\x01\x00", 8));
	size_t hlen = (unsigned char)raw[8] | (size_t)(unsigned char)raw[9] << 8;
	CHECK((10 + hlen) % 64 == 0);
	CHECK(raw[10 + hlen - 1] == '\n');
	CHECK(strstr(raw + 10, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }") == raw + 10);
	CHECK(len == 10 + hlen + sizeof d);
	free(raw);
	struct npy_array a;
	REQUIRE(npy_read(path, &a, &e) == 0);
	CHECK(a.dtype == NPY_F32 && a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3);
	CHECK(!memcmp(a.data, d, sizeof d));
	npy_free(&a);
	/* 1-d int32 uses the "(n,)" tuple form; 0 rows is valid */
	int32_t v[3] = {-1, 7, 2147483647};
	int64_t s1[1] = {3};
	REQUIRE(npy_write(path, NPY_I32, 1, s1, v, &e) == 0);
	raw = file_read(path, &len, 1 << 20, NULL);
	CHECK(raw && strstr(raw + 10, "'shape': (3,), }"));
	free(raw);
	REQUIRE(npy_read(path, &a, &e) == 0);
	CHECK(a.dtype == NPY_I32 && a.ndim == 1 && ((int32_t *)a.data)[2] == 2147483647);
	npy_free(&a);
	int64_t s0[2] = {0, 5};
	REQUIRE(npy_write(path, NPY_F32, 2, s0, v, &e) == 0);
	REQUIRE(npy_read(path, &a, &e) == 0);
	CHECK(a.shape[0] == 0 && a.shape[1] == 5 && a.nbytes == 0);
	npy_free(&a);
}

TEST(npy, npz_round_trip_and_zip_structure)
{
	char path[512];
	snprintf(path, sizeof path, "%s/b.npz", test_tmpdir());
	struct err e;
	struct npz_writer *z = npz_open(path, &e);
	REQUIRE(z);
	float f[4] = {1, 2, 3, 4};
	int32_t k[6] = {0, 1, -1, 5, 4, 3};
	int64_t sf[2] = {2, 2}, sk[2] = {3, 2};
	CHECK(npz_add(z, "seq0", NPY_F32, 2, sf, f) == 0);
	CHECK(npz_add(z, "s0_l1", NPY_I32, 2, sk, k) == 0);
	REQUIRE(npz_close(z, &e) == 0);
	struct npy_array a;
	REQUIRE(npz_read(path, "s0_l1", &a, &e) == 0);
	CHECK(a.dtype == NPY_I32 && a.shape[0] == 3 && !memcmp(a.data, k, sizeof k));
	npy_free(&a);
	REQUIRE(npz_read(path, "seq0", &a, &e) == 0);
	CHECK(a.dtype == NPY_F32 && !memcmp(a.data, f, sizeof f));
	npy_free(&a);
	CHECK(npz_read(path, "missing", &a, &e) == -ENOENT);
	CHECK_CONTAINS(e.msg, "no entry missing.npy");
	/* the archive: local header of entry 0 at 0, stored, CRC over the .npy bytes */
	size_t len;
	unsigned char *raw = (unsigned char *)file_read(path, &len, 1 << 20, NULL);
	REQUIRE(raw && len > 100);
	CHECK(raw[0] == 'P' && raw[1] == 'K' && raw[2] == 3 && raw[3] == 4);
	CHECK(raw[8] == 0 && raw[9] == 0); /* method: stored */
	uint32_t crc = raw[14] | raw[15] << 8 | raw[16] << 16 | (uint32_t)raw[17] << 24;
	uint32_t size = raw[18] | raw[19] << 8 | raw[20] << 16 | (uint32_t)raw[21] << 24;
	CHECK(!memcmp(raw + 30, "seq0.npy", 8));
	CHECK(crc == npy_crc32(0, raw + 38, size));
	CHECK(raw[len - 22] == 'P' && raw[len - 21] == 'K' && raw[len - 20] == 5 && raw[len - 19] == 6);
	CHECK(raw[len - 12] == 2); /* two entries */
	free(raw);
}

TEST(npy, rejects_malformed)
{
	struct npy_array a;
	struct err e;
	CHECK(npy_parse((const uint8_t *)"hello world", 11, &a, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "magic");
	const char bad[] = "\x93NUMPY\x01\x00\x20\x00{'descr': '<f8', 'shape': (1,), }";
	CHECK(npy_parse((const uint8_t *)bad, sizeof bad - 1, &a, &e) == -EINVAL);
	char trunc[128];
	int64_t s[1] = {100};
	char path[512];
	snprintf(path, sizeof path, "%s/t.npy", test_tmpdir());
	float big[100] = {0};
	REQUIRE(npy_write(path, NPY_F32, 1, s, big, &e) == 0);
	size_t len;
	char *raw = file_read(path, &len, 1 << 20, NULL);
	memcpy(trunc, raw, sizeof trunc);
	free(raw);
	CHECK(npy_parse((const uint8_t *)trunc, sizeof trunc, &a, &e) == -EINVAL);
	CHECK_CONTAINS(e.msg, "truncated");
	CHECK(npz_read(path, "x", &a, &e) == -EINVAL); /* an .npy is not a zip */
}
