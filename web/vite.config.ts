import { defineConfig } from 'vite';

// kstate serves the built files at /ui/ (http.ui_dir in its config): same origin as
// the API, so the page needs no CORS and no address of its own. `npm run dev` proxies
// the API to a running kstate (KSTATE_URL, default the demo's port).
const api = process.env.KSTATE_URL ?? 'http://127.0.0.1:8080';

export default defineConfig({
  base: '/ui/',
  esbuild: { jsx: 'automatic', jsxImportSource: 'preact' },
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    target: 'es2022',
    // Hashed names under assets/: kstate lets browsers cache those for a year.
    assetsDir: 'assets',
    sourcemap: false,
    chunkSizeWarningLimit: 200,
  },
  server: {
    proxy: Object.fromEntries(
      ['/v1', '/readyz', '/livez', '/metrics', '/openapi.json'].map((p) => [p, { target: api }]),
    ),
  },
});
