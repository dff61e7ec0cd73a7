/*
 * client_int.h — what tests (and only tests) may see inside a dsv32_t: the mapping of its
 * shared region, so that a hostile client can be simulated with the real handshake.
 */
#ifndef DSV32_IPC_CLIENT_INT_H
#define DSV32_IPC_CLIENT_INT_H

#include <stddef.h>

#include "ipc/dsv32.h"

void *ipc_client_region(dsv32_t *h, size_t *bytes);
int ipc_client_socket(dsv32_t *h);

#endif
