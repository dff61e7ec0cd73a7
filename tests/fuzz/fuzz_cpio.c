/*
 * fuzz_cpio.c — libFuzzer target for the appliance image's archive reader
 * (tools/mkimage/cpio.h): cpio_walk on arbitrary bytes. Every entry it hands out must lie
 * inside the input (its name NUL-terminated there, its data within it); a refusal says why.
 */
#include <stdint.h>
#include <string.h>

#include "tools/mkimage/cpio.h"
#include "tests/fuzz/fuzz.h"

struct span {
	const unsigned char *p;
	size_t n;
	int entries;
};

volatile unsigned fuzz_cpio_sink; /* (where the bytes' sum goes, so the reads stay) */

static int check_entry(void *ctx, const struct cpio_entry *e)
{
	const struct span *s = ctx;
	const unsigned char *name = (const unsigned char *)e->name;
	FUZZ_CHECK(name >= s->p && name < s->p + s->n);
	FUZZ_CHECK(memchr(name, 0, (size_t)(s->p + s->n - name)) != NULL);
	FUZZ_CHECK(e->data >= s->p && e->data <= s->p + s->n);
	FUZZ_CHECK(e->size <= (size_t)(s->p + s->n - e->data));
	unsigned sum = 0; /* (touch every byte it claims: ASan checks each read) */
	for (uint32_t i = 0; i < e->size; i++)
		sum += e->data[i];
	fuzz_cpio_sink = sum;
	((struct span *)ctx)->entries++;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct span s = {data, size, 0};
	const char *why = NULL;
	if (cpio_walk(data, size, check_entry, &s, &why))
		FUZZ_CHECK(why && why[0]);
	return 0;
}
