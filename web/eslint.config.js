// ESLint for the dashboard (flat config), run by `npm run lint` and by scripts/lint.
// The pages get the type-aware rules: most dashboard bugs are a promise nobody awaits
// or a value the API types say can be missing. Build files run in node.

import js from '@eslint/js';
import { defineConfig } from 'eslint/config';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default defineConfig(
  // Generated from docs/openapi.json before every build and lint; not ours to style.
  { ignores: ['dist/', 'node_modules/', 'src/api.gen.ts'] },
  {
    files: ['src/**/*.{ts,tsx}'],
    extends: [js.configs.recommended, tseslint.configs.recommendedTypeChecked],
    languageOptions: {
      globals: globals.browser,
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
  },
  {
    files: ['*.{js,ts}'],
    extends: [js.configs.recommended, tseslint.configs.recommended],
    languageOptions: { globals: globals.node },
  },
);
