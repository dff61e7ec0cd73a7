/*
 * errors.c — names and descriptions of the typed errors in dsv32.h.
 */
#include "ipc/dsv32.h"

static const struct {
	const char *name, *text;
} errors[DSV32_E_COUNT] = {
	[DSV32_OK] = {"ok", "no error"},
	[DSV32_E_BAD_FRAME] = {"bad_frame", "malformed record or ring state (protocol violation)"},
	[DSV32_E_VERSION] = {"version_mismatch", "client and server protocol versions differ"},
	[DSV32_E_PROMPT_TOO_LONG] = {"prompt_too_long", "the prompt exceeds the configured limit"},
	[DSV32_E_BAD_PARAM] = {"bad_parameter", "a request parameter is out of range"},
	[DSV32_E_BAD_TOKEN] = {"bad_token_id", "a token id is outside the vocabulary"},
	[DSV32_E_BAD_UTF8] = {"invalid_utf8", "text is not valid UTF-8"},
	[DSV32_E_TOO_LARGE] = {"message_too_large", "the message is larger than the data area allows"},
	[DSV32_E_QUEUE_FULL] = {"queue_full", "too many requests in flight"},
	[DSV32_E_TOO_MANY_CLIENTS] = {"too_many_clients", "the server's client limit is reached"},
	[DSV32_E_BUSY] = {"busy", "the client does not drain its completion ring"},
	[DSV32_E_DRAINING] = {"draining", "the server is shutting down"},
	[DSV32_E_ENGINE_FAULT] = {"engine_fault", "the engine hit an unrecoverable error"},
	[DSV32_E_CANCELLED] = {"cancelled", "the request was cancelled"},
	[DSV32_E_SERVER_LOST] = {"server_lost", "the server went away"},
};

const char *dsv32_error_name(int code)
{
	return code >= 0 && code < DSV32_E_COUNT ? errors[code].name : "unknown";
}

const char *dsv32_error_text(int code)
{
	return code >= 0 && code < DSV32_E_COUNT ? errors[code].text : "unknown error";
}

const char *dsv32_version(void) { return "0.1.0"; }
