/* main.c — the `kda` host: embeds LuaJIT and hands the command line to lua/kda/cli.lua.
 *
 * This is the only C file that knows about Lua. It finds the library (KDA_HOME, else the
 * folder of the executable), installs the Ctrl-C flag, offers line editing to the REPL, and
 * turns any uncaught Lua error into one line on stderr and a non-zero exit.                 */
#include <editline/readline.h>
#include <lauxlib.h>
#include <libgen.h>
#include <limits.h>
#include <lua.h>
#include <lualib.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include "internal.h"

/* ---- Ctrl-C: the first asks the training loop to stop after the current step; the second
 * ends the process at once. ------------------------------------------------------------- */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
  (void)sig;
  if (interrupted) _exit(130);
  interrupted = 1;
}

int kda_interrupted(void) { return interrupted; }
void kda_clear_interrupt(void) { interrupted = 0; }

/* ---- line editing for the REPL (libedit) ------------------------------------------------- */
static char *last_line;

const char *kda_readline(const char *prompt) {
  free(last_line);
  interrupted = 0;
  last_line = readline(prompt);
  return last_line;
}

void kda_history_add(const char *line) { add_history(line); }
int kda_history_load(const char *path) { return read_history(path); }
int kda_history_save(const char *path) { return write_history(path); }

const char *kda_version(void) { return "kda 0.1.0 (git " KDA_GIT_REV ")"; }

/* ---- the host ------------------------------------------------------------------------------ */
static void find_root(char *root, size_t n) {
  const char *env = getenv("KDA_HOME");
  if (env && *env) { snprintf(root, n, "%s", env); return; }
  char exe[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k <= 0) { snprintf(root, n, "."); return; }
  exe[k] = 0;
  snprintf(root, n, "%s", dirname(exe));
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) msg = "(error object is not a string)";
  if (getenv("KDA_TRACE")) luaL_traceback(L, L, msg, 1);
  else lua_pushstring(L, msg);
  return 1;
}

int main(int argc, char **argv) {
  char root[PATH_MAX], path[3 * PATH_MAX];
  find_root(root, sizeof root);
  signal(SIGINT, on_sigint);
  lua_State *L = luaL_newstate();
  if (!L) { fprintf(stderr, "kda: cannot create a Lua state (out of memory)\n"); return 1; }
  luaL_openlibs(L);
  snprintf(path, sizeof path, "%s/lua/?.lua;%s/lua/?/init.lua;", root, root);
  lua_getglobal(L, "package");
  lua_pushfstring(L, "%s%s", path, "./?.lua");
  lua_setfield(L, -2, "path");
  lua_pop(L, 1);
  lua_pushstring(L, root);
  lua_setglobal(L, "KDA_ROOT");

  lua_pushcfunction(L, traceback);
  lua_getglobal(L, "require");
  lua_pushstring(L, "kda.cli");
  if (lua_pcall(L, 1, 1, 1)) {
    fprintf(stderr, "kda: cannot load the Lua library from %s/lua: %s\n"
            "HINT: set KDA_HOME to the kda source folder\n", root, lua_tostring(L, -1));
    return 1;
  }
  lua_getfield(L, -1, "main");
  lua_newtable(L);
  for (int i = 1; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i);
  }
  int rc = 0;
  if (lua_pcall(L, 1, 1, 1)) {
    fprintf(stderr, "kda: %s\n", lua_tostring(L, -1));
    rc = 1;
  } else if (lua_isnumber(L, -1)) {
    rc = (int)lua_tointeger(L, -1);
  }
  lua_close(L);
  return rc;
}
