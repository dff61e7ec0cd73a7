/*
 * cmd_bench_tok.c — `dsv32 bench tokenizer`: encode and decode throughput of the C tokenizer
 * on one core, side by side with the JavaScript reference run in the same command.
 *
 *   dsv32 bench tokenizer [--model DIR | --tokenizer FILE] [--corpus FILE] [--min-mb N]
 *                         [--no-ref]
 *
 * The workload is the records of the test corpus (tests/tokenizer/corpus.bin: prose in ten
 * languages, CJK, code, chat prompts with added tokens, random code points, whitespace and digit
 * runs, invalid UTF-8), repeated until at least N MB (default 10), each record encoded as one
 * call with added tokens recognised (the reference's mode), then each record's ids decoded.
 * The C encoder is timed with its word cache (the default) and without it; the reference (node
 * tests/tokenizer/ref_encode.mjs --bench) keeps its own LRU word cache. Prints MB/s (1e6 bytes
 * of input text per CPU second: this thread's for C, the node process's for the reference) and
 * the ratios; asserts nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/fileio.h"
#include "model/tokenizer.h"
#include "tools/cli/cli.h"

/* CPU time of this thread: the build machines are shared, so wall time measures the neighbours;
 * the reference reports its process's CPU time (process.cpuUsage) the same way. */
static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double json_num(const char *s, const char *key)
{
	char k[64];
	snprintf(k, sizeof k, "\"%s\":", key);
	const char *p = strstr(s, k);
	return p ? strtod(p + strlen(k), NULL) : -1;
}

int bench_tokenizer(int argc, char **argv)
{
	const char *tpath = "build/tokenizer", *corpus = "tests/tokenizer/corpus.bin";
	double min_mb = 10;
	int no_ref = 0;
	for (int i = 1; i < argc; i++) {
		if ((!strcmp(argv[i], "--model") || !strcmp(argv[i], "--tokenizer")) && i + 1 < argc)
			tpath = argv[++i];
		else if (!strcmp(argv[i], "--corpus") && i + 1 < argc)
			corpus = argv[++i];
		else if (!strcmp(argv[i], "--min-mb") && i + 1 < argc)
			min_mb = atof(argv[++i]);
		else if (!strcmp(argv[i], "--no-ref"))
			no_ref = 1;
		else {
			fprintf(stderr, "usage: dsv32 bench tokenizer [--model DIR | --tokenizer FILE] "
					"[--corpus FILE] [--min-mb N] [--no-ref]\n");
			return 2;
		}
	}
	struct tokenizer *t;
	struct err e;
	if (tokenizer_load(&t, tpath, &e)) {
		fprintf(stderr, "dsv32: %s\n", e.msg);
		return 1;
	}
	size_t len;
	char *buf = file_read(corpus, &len, 1u << 30, &e);
	if (!buf) {
		fprintf(stderr, "dsv32: %s\n", e.msg);
		tokenizer_free(t);
		return 1;
	}
	/* Records of the corpus, repeated until min_mb. */
	size_t n = 0, cap = 0, bytes = 0;
	const char **rec = NULL;
	size_t *rlen = NULL;
	while (bytes < (size_t)(min_mb * 1e6)) {
		size_t before = bytes;
		for (size_t p = 0; p < len;) {
			char *end;
			unsigned long k = strtoul(buf + p, &end, 10);
			if (*end != '\n' || (size_t)(end - buf) + 1 + k >= len + 1)
				break;
			if (n == cap) {
				cap = cap ? cap * 2 : 4096;
				rec = realloc(rec, cap * sizeof *rec);
				rlen = realloc(rlen, cap * sizeof *rlen);
				if (!rec || !rlen) {
					fprintf(stderr, "dsv32: out of memory\n");
					return 1;
				}
			}
			rec[n] = end + 1;
			rlen[n++] = k;
			bytes += k;
			p = (size_t)(end - buf) + 1 + k + 1;
		}
		if (bytes == before) {
			fprintf(stderr, "dsv32: %s: no records\n", corpus);
			return 1;
		}
	}
	/* All records' ids go into one growing array (encode appends), offsets kept for decode. */
	struct tokenizer_ids ids = {0}, tmp = {0};
	size_t *off = malloc((n + 1) * sizeof *off);
	if (!off) {
		fprintf(stderr, "dsv32: out of memory\n");
		return 1;
	}
	double t0 = now();
	for (size_t i = 0; i < n; i++) {
		off[i] = ids.n;
		tokenizer_encode(t, rec[i], rlen[i], TOKENIZER_SPECIAL, &ids);
	}
	off[n] = ids.n;
	double enc = now() - t0;
	t0 = now();
	for (size_t i = 0; i < n; i++) {
		tmp.n = 0;
		tokenizer_encode(t, rec[i], rlen[i], TOKENIZER_SPECIAL | TOKENIZER_NO_CACHE, &tmp);
	}
	double enc_cold = now() - t0;
	struct sbuf out = {0};
	t0 = now();
	for (size_t i = 0; i < n; i++) {
		out.len = 0;
		tokenizer_decode(t, ids.v + off[i], off[i + 1] - off[i], 0, &out);
	}
	double dec = now() - t0;
	size_t tokens = ids.n;
	double mb = (double)bytes / 1e6;
	printf("tokenizer bench: %zu records, %.1f MB, %zu tokens (%.2f bytes/token), one core\n", n,
	       mb, tokens, (double)bytes / (double)tokens);
	printf("  C  encode          %8.1f MB/s   (word cache on, the default)\n", mb / enc);
	printf("  C  encode no cache %8.1f MB/s\n", mb / enc_cold);
	printf("  C  decode          %8.1f MB/s   (of input text)\n", mb / dec);
	int rc = 0;
	if (!no_ref) {
		char cmd[2048], line[1024] = "";
		snprintf(cmd, sizeof cmd,
			 "node tests/tokenizer/ref_encode.mjs --bench '%s' --min-mb %g --tokenizer '%s%s'",
			 corpus, min_mb, tpath,
			 strstr(tpath, ".json") ? "" : "/tokenizer.json");
		FILE *f = popen(cmd, "r");
		if (!f || !fgets(line, sizeof line, f) || pclose(f) != 0) {
			fprintf(stderr, "dsv32: the JavaScript reference did not run (%s); make tokenizer "
					"installs it\n", cmd);
			rc = 1;
		} else {
			double jb = json_num(line, "bytes") / 1e6, je = json_num(line, "encode_s"),
			       jd = json_num(line, "decode_s"), jt = json_num(line, "tokens");
			printf("  JS encode          %8.1f MB/s   (@lenml/tokenizers 3.7.2 under node)\n",
			       jb / je);
			printf("  JS decode          %8.1f MB/s\n", jb / jd);
			printf("  ratio C/JS: encode %.1fx (no cache %.1fx), decode %.1fx; tokens C %zu, "
			       "JS %.0f\n",
			       (mb / enc) / (jb / je), (mb / enc_cold) / (jb / je), (mb / dec) / (jb / jd),
			       tokens, jt);
		}
	}
	printf("  command: dsv32 bench tokenizer --tokenizer %s --corpus %s --min-mb %g\n", tpath,
	       corpus, min_mb);
	tokenizer_ids_free(&ids);
	free(off);
	tokenizer_ids_free(&tmp);
	sbuf_free(&out);
	free(rec);
	free(rlen);
	free(buf);
	tokenizer_free(t);
	return rc;
}
