/* mkmodel.c — placeholder entry until the checkpoint writer lands (see issue 2). */
#include <stdio.h>
int main(void)
{
	fprintf(stderr, "mkmodel: not built yet\n");
	return 1;
}
