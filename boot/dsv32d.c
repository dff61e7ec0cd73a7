/*
 * dsv32d.c — the daemon's main: flags, the model load, and (later) the serving loop.
 *
 * Today it loads and validates a checkpoint's config and lists the GPU kernels built into the
 * binary; the serving loop (ipc/) is not built yet, so it exits after the checks with status 3
 * and says so. It never pretends to serve.
 */
#include <stdio.h>
#include <string.h>

#include "driver/kernels.h"
#include "ipc/dsv32.h"
#include "model/config.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: dsv32d --model DIR\n");
}

int main(int argc, char **argv)
{
	const char *model = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--model") && i + 1 < argc) {
			model = argv[++i];
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	fprintf(stderr, "<6>dsv32d %s: %d embedded GPU kernel module(s)%s\n", dsv32_version(),
		n_kernel_images, n_kernel_images ? "" : " (CPU-only build)");
	for (int i = 0; i < n_kernel_images; i++)
		fprintf(stderr, "<7>  kernel module %s: %ld B PTX, %ld B sm_90a cubin\n",
			kernel_images[i].name, kernel_images[i].ptx_len, kernel_images[i].cubin_len);
	if (!model) {
		usage(stderr);
		return 2;
	}
	struct dsv32_config c;
	struct err e;
	if (config_load(&c, model, &e)) {
		fprintf(stderr, "<3>dsv32d: %s\n", e.msg);
		return 1;
	}
	fprintf(stderr, "<6>dsv32d: %s: %lld layers, hidden %lld, vocab %lld\n", model,
		(long long)c.num_hidden_layers, (long long)c.hidden_size, (long long)c.vocab_size);
	fprintf(stderr, "<3>dsv32d: serving is not implemented yet; exiting after the checks\n");
	return 3;
}
