/*
 * nvdev.c — the NVIDIA driver's device nodes: the plan from /proc, then mknod.
 */
#include "boot/init/nvdev.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "model/fileio.h"

/* The majors of the "Character devices:" part of a /proc/devices text; -1 where absent */
static void char_majors(const char *text, int *ctl, int *uvm)
{
	*ctl = *uvm = -1;
	const char *p = strstr(text, "Character devices:");
	const char *end = strstr(text, "Block devices:");
	for (p = p ? strchr(p, '\n') : NULL; p && *p && (!end || p < end); p = strchr(p, '\n')) {
		char name[64];
		int major;
		p++;
		if (sscanf(p, "%d %63s", &major, name) != 2)
			continue;
		if (!strcmp(name, "nvidia-frontend") || !strcmp(name, "nvidia"))
			*ctl = major;
		else if (!strcmp(name, "nvidia-uvm"))
			*uvm = major;
	}
}

/* "Device Minor:" of one GPU's information file; -1 with e when it has none */
static int gpu_minor(const char *path, struct err *e)
{
	char *text = file_read_stream(path, 16384, e);
	if (!text)
		return -1;
	const char *p = strstr(text, "Device Minor:");
	int minor = -1;
	if (p)
		sscanf(p + strlen("Device Minor:"), "%d", &minor);
	free(text);
	if (minor < 0 || minor >= NVDEV_CTL_MINOR - 1) { /* 254 is nvidia-modeset's */
		err_set(e, -EINVAL, "%s: no \"Device Minor: N\" line with N in 0..253", path);
		return -1;
	}
	return minor;
}

static int by_minor(const void *a, const void *b)
{
	return (int)((const struct nvdev_node *)a)->minor - (int)((const struct nvdev_node *)b)->minor;
}

static void node_set(struct nvdev_node *n, const char *name, int major, int minor)
{
	snprintf(n->name, sizeof n->name, "%s", name);
	n->major = (unsigned)major;
	n->minor = (unsigned)minor;
}

int nvdev_plan(const char *proc, struct nvdev_node *out, int max, struct err *e)
{
	char path[512];
	snprintf(path, sizeof path, "%s/devices", proc);
	char *text = file_read_stream(path, 1 << 16, e);
	if (!text)
		return -EIO;
	int ctl, uvm;
	char_majors(text, &ctl, &uvm);
	free(text);
	if (ctl < 0)
		return 0;
	if (uvm < 0)
		return err_set(e, -ENODEV, "%s: the NVIDIA driver (major %d) without nvidia-uvm: "
			       "load nvidia-uvm.ko after nvidia.ko (CUDA needs both)", path, ctl);
	if (max < 3)
		return err_set(e, -ERANGE, "nvdev_plan: room for %d nodes", max);
	int n = 0;
	node_set(&out[n++], "nvidiactl", ctl, NVDEV_CTL_MINOR);
	node_set(&out[n++], "nvidia-uvm", uvm, 0);
	node_set(&out[n++], "nvidia-uvm-tools", uvm, 1);

	snprintf(path, sizeof path, "%s/driver/nvidia/gpus", proc);
	DIR *d = opendir(path);
	if (!d)
		return n; /* the driver with no GPU bound: its control nodes only */
	const int first_gpu = n;
	struct dirent *de;
	int r = 0;
	while (!r && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		char info[1024];
		int minor = -1;
		if (snprintf(info, sizeof info, "%s/%s/information", path, de->d_name) >=
		    (int)sizeof info)
			r = err_set(e, -ENAMETOOLONG, "%s/%s: path too long", path, de->d_name);
		else if ((minor = gpu_minor(info, e)) < 0)
			r = -EINVAL;
		else if (n == max)
			r = err_set(e, -ERANGE, "%s: more than %d GPUs", path, max - first_gpu);
		else {
			char name[24];
			snprintf(name, sizeof name, "nvidia%d", minor);
			node_set(&out[n++], name, ctl, minor);
		}
	}
	closedir(d);
	if (r)
		return r;
	qsort(out + first_gpu, (size_t)(n - first_gpu), sizeof *out, by_minor);
	return n;
}

int nvdev_make(const char *dev, const struct nvdev_node *nodes, int count, struct err *e)
{
	for (int i = 0; i < count; i++) {
		char path[512];
		snprintf(path, sizeof path, "%s/%s", dev, nodes[i].name);
		const dev_t want = makedev(nodes[i].major, nodes[i].minor);
		struct stat st;
		if (!lstat(path, &st)) {
			if (S_ISCHR(st.st_mode) && st.st_rdev == want)
				continue;
			return err_set(e, -EEXIST, "%s exists and is not the character device %u:%u",
				       path, nodes[i].major, nodes[i].minor);
		}
		if (mknod(path, S_IFCHR | 0666, want))
			return err_set(e, -errno, "mknod %s (character device %u:%u): %s", path,
				       nodes[i].major, nodes[i].minor, strerror(errno));
		if (chmod(path, 0666)) /* mknod's mode is under the umask */
			return err_set(e, -errno, "chmod 0666 %s: %s", path, strerror(errno));
	}
	return 0;
}
